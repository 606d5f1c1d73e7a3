"""Quantities with units, as a learner types them: ``"208"``, ``"208 GB"``, ``"2.1e11"``, ``"1.5k"``, ``"3 ms"``,
``"400 Gb/s"`` (drills notebook of lesson 16: the estimation checker and the follow-ups that quote your numbers).

Every unit maps to a dimension and a factor to its base unit (bytes, seconds, FLOP, a plain number): GB is 1e9
bytes, GiB 2**30, Gb 1e9 bits (1/8 of a GB: a lower-case b is a bit), ms 1e-3 s, % 0.01.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40}


def _unit_table() -> dict[str, tuple[str, float]]:
    """``{spelling: (dimension, factor to the base unit)}``."""
    units: dict[str, tuple[str, float]] = {}
    for prefix, factor in {**_SI, **_BINARY}.items():
        units[f"{prefix}B"] = ("B", factor)
        units[f"{prefix}B/s"] = ("B/s", factor)
    for prefix, factor in _SI.items():
        units[f"{prefix}b"] = ("B", factor / 8)  # bits: a link's "400 Gb/s" is 50 GB/s
        units[f"{prefix}b/s"] = units[f"{prefix}bps"] = ("B/s", factor / 8)
        units[f"{prefix}FLOP"] = units[f"{prefix}FLOPs"] = ("FLOP", factor)
        units[f"{prefix}FLOP/s"] = units[f"{prefix}FLOPS"] = ("FLOP/s", factor)
    units.update({"ns": ("s", 1e-9), "us": ("s", 1e-6), "µs": ("s", 1e-6), "μs": ("s", 1e-6), "ms": ("s", 1e-3),
                  "s": ("s", 1.0), "sec": ("s", 1.0), "min": ("s", 60.0), "h": ("s", 3600.0), "hours": ("s", 3600.0),
                  "days": ("s", 86400.0), "FLOP/B": ("FLOP/B", 1.0), "%": ("1", 0.01), "x": ("1", 1.0),
                  "tokens/s": ("tokens/s", 1.0), "tok/s": ("tokens/s", 1.0)})
    for count in ("requests", "sequences", "GPUs", "replicas"):
        units[count] = ("1", 1.0)
    return units


UNITS = _unit_table()
DIMENSION_NAMES = {"B": "a size in bytes", "B/s": "a bandwidth", "s": "a time", "FLOP": "a FLOP count",
                   "FLOP/s": "a FLOP rate", "FLOP/B": "an intensity (FLOP per byte)", "1": "a plain number",
                   "tokens/s": "a token rate"}
NUMBER = r"[+-]?(?:\d[\d,_]*(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_WORDS = ("about", "approx.", "approx", "roughly", "~", "≈", "=")


@dataclass(frozen=True)
class Quantity:
    """A number and the unit it was written in (``unit`` ``""`` when none was given)."""

    number: float
    unit: str = ""

    @property
    def dimension(self) -> str | None:
        return UNITS[self.unit][0] if self.unit else None

    def to(self, unit: str) -> float:
        """The number in ``unit`` (a bare number is read as already in ``unit``)."""
        return self.number if not self.unit else self.number * UNITS[self.unit][1] / UNITS[unit][1]


def parse_quantity(text: str) -> Quantity:
    """``"1.5k"`` -> 1500, ``"208 GB"`` -> (208, "GB"), ``"2.1e11 B"``, ``"17.9 %"``. Raises ``ValueError`` with what
    to write instead when the text is not one number with an optional multiplier (k, M, G, T) and unit."""
    s = text.strip()
    for word in _WORDS:
        s = s.removeprefix(word).strip()
    match = re.fullmatch(rf"({NUMBER})\s*(.*?)\s*", s)
    if not match:
        raise ValueError(f"could not read {text.strip()!r} as a number: write e.g. 208, 208 GB, 2.1e11 or 1.5k")
    number, rest = float(match.group(1).replace(",", "").replace("_", "")), match.group(2)
    if rest in UNITS or not rest:
        return Quantity(number, rest)
    multiplier, unit = rest[0], rest[1:].strip()
    if multiplier in _SI and multiplier and (unit in UNITS or not unit):
        return Quantity(number * _SI[multiplier], unit)
    raise ValueError(f"unit {rest!r} in {text.strip()!r} not understood: write one of B, KB, MB, GB (1e9 bytes), "
                     f"GiB (2**30), Gb (bits), GB/s, ms, us, s, min, h, FLOP, TFLOP/s, FLOP/B, %, x")


def quantities_in(text: str) -> list[tuple[int, str, Quantity]]:
    """Every ``number unit`` written in free text, as ``(where, as written, Quantity)``, in order; numbers without
    a unit are left out (a follow-up quotes your numbers with their units)."""
    found = []
    for match in re.finditer(rf"(?<![\w.])({NUMBER})\s?([A-Za-zµμ%][A-Za-z/µμ]*|%)?", text):
        if not match.group(2):
            continue
        unit = match.group(2)
        for candidate in (unit, unit.rstrip("/")):  # "494 ms/step" is read as 494 ms
            try:
                quantity = parse_quantity(f"{match.group(1)} {candidate}")
            except ValueError:
                continue
            if quantity.unit:
                found.append((match.start(), f"{match.group(1)} {candidate}".replace(" %", "%"), quantity))
            break
    return found
