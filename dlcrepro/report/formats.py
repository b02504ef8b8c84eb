"""How every table, finding and figure label prints a number: the one home of each format, and of the
text of the paper's numbers (paper.py holds them as numbers). No torch, no pandas: the summary
figure, the tables and the findings all read it.
"""

from __future__ import annotations

import math

import numpy as np

from . import paper as P


def number(x, digits: int = 3) -> str:
    """A value as every table, finding and figure prints it: a float to `digits` significant digits
    ("0.0206", "7.91"), in scientific notation below 1e-3 ("1.23e-04"); anything else (an int, a
    text) as it is; "n/a" for None or NaN."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float):
        return f"{x:.{digits}g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.{digits - 1}e}"
    return str(x)


def apart(x: float, margins=(), digits: int = 3) -> str:
    """`x` to `digits` significant digits, or more where fewer would print it on a margin or on the
    other side of one: 2.005 against 2 prints "2.005", not "2"; 1.9951 against 1.996 "1.9951"."""
    if x is None or math.isnan(x):
        return "n/a"
    for d in range(digits, 17):
        shown = float(f"{x:.{d}g}")
        if all(np.sign(shown - m) == np.sign(x - m) for m in margins if math.isfinite(m)):
            return f"{x:.{d}g}"
    return repr(x)


def interval_text(mean: float, low: float, high: float, margins=(), unit: str = "") -> str:
    """"1.21x [0.719, 2.005]": a mean (with `unit`) and its interval, each printed by `apart`, so to
    3 significant digits or more where fewer would print it on or across one of `margins`; "n/a"
    without a mean."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "n/a"
    return f"{apart(mean, margins)}{unit} [{apart(low, margins)}, {apart(high, margins)}]"


def signed(x: float, margins=()) -> str:
    """`apart` with its sign always shown: "+2.7", "-1.2"; "n/a" for NaN."""
    text = apart(x, margins)
    return text if text.startswith("-") or text == "n/a" else "+" + text


def fixed(x: float, decimals: int = 1, sign: bool = False) -> str:
    """`x` to `decimals` places, its sign shown where `sign`: "+31.4"."""
    return f"{x:{'+' if sign else ''}.{decimals}f}"


def significant(x: float, digits: int = 3, sign: bool = False) -> str:
    """`x` to `digits` significant digits in Python's "g" form, its sign shown where `sign`: "1.21", "+0.06"."""
    return f"{x:{'+' if sign else ''}.{digits}g}"


def pct(share: float, decimals: int = 1) -> str:
    """A share as a percentage: 0.465 → "46.5 %" (0.9 at 0 decimals → "90 %")."""
    return f"{100 * share:.{decimals}f} %"


def pct_interval(mean: float, low: float, high: float) -> str:
    """A share and its interval in percent: "46.5 % [40.1, 52.9]"; "n/a" without a mean."""
    if mean is None or mean != mean:
        return "n/a"
    return f"{100 * mean:.1f} % [{100 * low:.1f}, {100 * high:.1f}]"


def multiple(m: float) -> str:
    """A noise-floor multiple as the paper writes it: 13 → "13x", 1.9 → "1.9x"."""
    return f"{m:g}x"


# ----------------------------------------------------------------------------- the paper's numbers as text


def paper_multiple(cell: tuple[str, str]) -> str:
    """The paper's M for a (sampler, correction) cell as a table prints it: "13x (F3)", "<=2x; 0.6B:
    1.9x (F8)" where its headline is a bound; "" for a cell the paper gives no multiple for."""
    if cell not in P.MULTIPLE:
        return ""
    m = P.MULTIPLE[cell]
    if m.bound is None:
        return f"{multiple(m.value)} ({m.finding})"
    return f"<={multiple(m.bound)}; {m.model}: {multiple(m.value)} ({m.finding})"


def paper_multiple_short(cell: tuple[str, str]) -> str:
    """The paper's M for a cell as its finding states it: "13x", "<=2x (0.6B 1.9x)" where its
    headline is a bound."""
    m = P.MULTIPLE[cell]
    if m.bound is None:
        return multiple(m.value)
    return f"<={multiple(m.bound)} ({m.model} {multiple(m.value)})"


def paper_accuracy(cell: tuple[str, str]) -> str:
    """The paper's accuracy for a cell as a table prints it: "46.5 % (F4)"; "" where it gives none."""
    if cell not in P.ACCURACY:
        return ""
    share, finding = P.ACCURACY[cell]
    return f"{pct(share)} ({finding})"


def paper_multiple_accuracy(cell: tuple[str, str]) -> str:
    """The paper's M and accuracy for a cell: "32x, 12.2 %"."""
    return f"{paper_multiple_short(cell)}, {pct(P.ACCURACY[cell][0])}"


def paper_off_support(resync: str = "") -> str:
    """F11's off-support shares: as its finding states them ("90 %, <=14 %, <=11 %"), or beside the
    runs `resync` "without" ("~90 % at collapse, <=14 % before (F11)") or "with" resync
    ("<=11 % through step 40 (F11)")."""
    at, before, with_ = (pct(x, 0) for x in (P.F11_AT_COLLAPSE, P.F11_BEFORE_AT_MOST, P.F11_WITH_RESYNC_AT_MOST))
    if resync == "without":
        return f"~{at} at collapse, <={before} before (F11)"
    if resync == "with":
        return f"<={with_} through step {P.F11_THROUGH_STEP} (F11)"
    return f"{at}, <={before}, <={with_}"
