"""The Prometheus text format (0.0.4) and OpenMetrics 1.0, written directly.

A scrape renders every series afresh after each fast tick, so the escaped
`name{label="value"}` part of each series is kept between renders and only the values are
formatted: the render costs a fraction of prometheus_client's generic one. The output is
what the formats' specifications (and `promtool check metrics`) expect.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from gpunet.contract import unit_of

MAX_PREFIXES = 200_000  # a bound on the cache, should label values churn
# Label values come from the system (interface names, driver and model strings): bounded,
# so a strange driver cannot blow up every scrape.
MAX_LABEL_VALUE = 128


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_value(value: float) -> str:
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if value != value:
        return "NaN"
    return repr(float(value))


class Family:
    __slots__ = ("name", "type", "help", "label_names", "samples")

    def __init__(self, name: str, type_: str, help_: str, label_names: tuple[str, ...], samples: list):
        """samples: sequences whose [1] is the label values (in the order of `label_names`)
        and [2] the value: the exporter's own Samples as they were published, so that a
        scrape makes no tuple per sample."""
        self.name, self.type, self.help, self.label_names, self.samples = name, type_, help_, label_names, samples


class Renderer:
    def __init__(self) -> None:
        self._prefixes: dict[tuple[str, tuple], str] = {}  # (family, label values) -> 'name{labels} '
        # openmetrics -> family name -> (its samples, its text), as last rendered.
        self._texts: dict[bool, dict[str, tuple[list, str]]] = {True: {}, False: {}}

    def _prefix(self, sample: str, names: tuple, values: tuple) -> str:
        key = (sample, values)
        prefix = self._prefixes.get(key)
        if prefix is None:
            if len(self._prefixes) > MAX_PREFIXES:
                self._prefixes.clear()
            if names:
                labels = ",".join(f'{n}="{escape_label(v[:MAX_LABEL_VALUE])}"'
                                  for n, v in sorted(zip(names, values)))
                prefix = f"{sample}{{{labels}}} "
            else:
                prefix = f"{sample} "
            self._prefixes[key] = prefix
        return prefix

    def render(self, families: Iterable[Family], openmetrics: bool) -> bytes:
        out: list[str] = []
        texts = self._texts[openmetrics]
        for fam in families:
            if not fam.samples:
                continue
            # Many families hold the same values scrape after scrape (configuration, info,
            # counters that did not move): comparing the samples costs less than formatting
            # them. (Equal values format alike, but for 0.0 and -0.0, which read the same.)
            cached = texts.get(fam.name)
            if cached is not None and cached[0] == fam.samples:
                out.append(cached[1])
                continue
            start = len(out)
            # OpenMetrics names a counter family without its _total; the text format names
            # the family as its samples are named.
            name = fam.name.removesuffix("_total") if openmetrics and fam.type == "counter" else fam.name
            out.append(f"# HELP {name} {escape_help(fam.help)}\n# TYPE {name} {fam.type}\n")
            if openmetrics and (unit := unit_of(name)):
                out.append(f"# UNIT {name} {unit}\n")
            prefixes, prefix = self._prefixes, self._prefix
            append = out.append
            family, names = fam.name, fam.label_names
            for sample in fam.samples:  # a thousand lines a scrape: the common case inline
                v, x = sample[1], float(sample[2])
                line = prefixes.get((family, v)) or prefix(family, names, v)
                append(f"{line}{repr(x) if x - x == 0 else format_value(x)}\n")  # x - x: 0 unless inf or NaN
            text = "".join(out[start:])
            del out[start:]
            out.append(text)
            texts[fam.name] = (fam.samples, text)
        if openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode()
