"""Print, one per line, the `uv pip install` options that make uv install from where pip would.

uv reads no pip configuration (pip.conf, PIP_* variables). This asks the venv's own pip for its
effective install options — index, extra indexes, find-links (on this project's machines the
local CPU build of torch), constraints, CA bundle, trusted hosts — through pip's own option
parser, so file and environment settings take pip's precedence. Run by scripts/setup.sh with
the venv's python; any failure here makes setup.sh install with pip instead.
"""

from pip._internal.commands import create_command

opts, _ = create_command("install").parse_args([])
args = ["--index-url", opts.index_url]
args += [a for url in opts.extra_index_urls for a in ("--extra-index-url", url)]
args += [a for loc in opts.find_links for a in ("--find-links", loc)]
args += [a for path in opts.constraints for a in ("--constraint", path)]
args += [a for host in opts.trusted_hosts for a in ("--allow-insecure-host", host)]
if opts.cert:
    args += ["--cert", opts.cert]
print("\n".join(args))
