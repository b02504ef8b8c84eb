#!/usr/bin/env bash
# TeX for tests/test_tables_tex.py, which compiles every table's .tex with pdflatex: Debian's
# texlive-latex-base (pdflatex, the array and longtable packages) and texlive-latex-recommended (booktabs), with
# no recommended extras (~40 MB installed). Does nothing where pdflatex is already on the PATH.
# Needs root or sudo for apt-get; otherwise it says what to install and exits 1.
set -euo pipefail
if command -v pdflatex >/dev/null && kpsewhich booktabs.sty >/dev/null && kpsewhich array.sty >/dev/null && kpsewhich longtable.sty >/dev/null; then
    exit 0
fi
PACKAGES=(texlive-latex-base texlive-latex-recommended)
if [[ $(id -u) == 0 ]]; then
    AS_ROOT=()
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    AS_ROOT=(sudo -n)
else
    echo "setup_tex.sh: pdflatex or booktabs missing and no root here: install ${PACKAGES[*]} (apt-get install --no-install-recommends)" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
"${AS_ROOT[@]}" apt-get update -qq
"${AS_ROOT[@]}" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
pdflatex --version | head -1
