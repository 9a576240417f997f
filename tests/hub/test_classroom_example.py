"""docs/classroom.example.yaml says what its sizes give in words (a size's display_name and
description); every number it states there is the one the file's own budgets and defaults make,
as the hub computes them for the size's least favoured user."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from jupyter_vgpu.hub.classroom import load_classroom

GIB = 1 << 30
EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "classroom.example.yaml"
# The phrases a size's words may state numbers in (written in the file, or made by the hub where
# the file has none), each with what the number must equal.
_GIB = r"(\d+(?:\.\d+)?) ?GiB"
BUDGET = re.compile(rf"{_GIB}, (\d+)% of a GPU|share {_GIB} of GPU memory and (\d+)% of a GPU's")
NOTEBOOKS = re.compile(r"[Uu]p to (\d+) notebooks")  # kernels of the default slice that fit in it
EACH = re.compile(rf"[Ee]ach with {_GIB} and (\d+)%|[Ee]ach starts with {_GIB} and (\d+)%")  # a kernel's default slice


def stated(size) -> dict[str, tuple[int, ...]]:
    """The numbers a size's words state, by phrase; a number in no known phrase fails the test,
    so that no sentence goes unchecked."""
    words = f"{size.display_name} | {size.description}"
    found = {}
    for name, phrase in (("budget", BUDGET), ("notebooks", NOTEBOOKS), ("each", EACH)):
        for match in phrase.finditer(words):
            found[name] = tuple(float(number) for number in match.groups() if number is not None)
        words = phrase.sub("", words)
    assert not re.search(r"\d", words), f"size {size.name!r} states a number this test cannot check: {words!r}"
    return found


@pytest.mark.parametrize("size", load_classroom(EXAMPLE).sizes, ids=lambda size: size.name)
def test_each_number_a_size_states_is_what_its_budget_and_defaults_make(size):
    budget = load_classroom(EXAMPLE).strictest_budget(size)
    numbers = stated(size)
    if "budget" in numbers:
        assert numbers["budget"] == (budget.memory / GIB, budget.cores)
    if "each" in numbers:
        assert numbers["each"] == (budget.kernel_memory / GIB, budget.kernel_cores)
    if "notebooks" in numbers:
        fit = min(budget.memory // budget.kernel_memory, budget.cores // budget.kernel_cores)
        if budget.kernels is not None:
            fit = min(fit, budget.kernels)
        assert numbers["notebooks"] == (fit,), f"{size.name}: {size.description}"


def test_the_example_states_numbers_somewhere():
    # The check above must have something to check.
    assert any(stated(size) for size in load_classroom(EXAMPLE).sizes)
