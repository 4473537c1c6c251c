"""Reading ``/metrics`` in tests: the exposition parsed by prometheus_client's own parser."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    """``{(sample name, frozenset(labels)): value}`` of every sample in the exposition ``text``."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name{labels}``; KeyError when the series does not exist (it was not initialised)."""
    return samples[(name, frozenset(labels.items()))]
