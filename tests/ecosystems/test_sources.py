"""How `ors-grpc serve SOURCE:SPEC` reads a source's spec (ors_grpc/adapters/_sources.py),
and what serve says when a source's extra is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from ors_grpc.adapters._generated import class_import_name, recipe_of_import_name
from ors_grpc.adapters._sources import SeededSplit, parse_source_spec
from tests.support.servers import ROOT


def test_a_spec_is_a_target_splits_and_options_parsed_as_json_where_they_parse() -> None:
    spec = parse_source_spec("leg_counting,gcd?split=train:10:0&split=test:5:7&min_animals=3&ratio=0.5"
                             "&flag=true&names=[1,2]&word=cat")
    assert spec.target == "leg_counting,gcd"
    assert spec.splits == (SeededSplit("train", 10, 0), SeededSplit("test", 5, 7))
    assert spec.options == {"min_animals": 3, "ratio": 0.5, "flag": True, "names": [1, 2], "word": "cat"}
    assert spec.take("word") == "cat" and spec.take("missing", default=4) == 4 and "word" not in spec.options
    assert parse_source_spec("a").splits is None and parse_source_spec("a").options == {}


@pytest.mark.parametrize("text, complaint", [
    ("a?split=train:10", "NAME:SIZE:SEED"),
    ("a?split=train:ten:0", "integers"),
    ("a?split=train:0:0", "SIZE of at least 1"),
    ("a?split=train:1:0&split=train:2:0", "distinct"),
    ("a?x=1&x=2", "given twice"),
    ("?x=1", "nothing to serve"),
    ("a?novalue", "bad query field"),
])
def test_a_spec_that_cannot_be_read_says_why(text: str, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        parse_source_spec(text)


def test_a_recipe_survives_its_import_name_which_has_no_dots() -> None:
    recipe = {"name": "a+b", "parts": [["a", 0.5, {"x": 1.5}]], "splits": [["train", 10, 0]]}
    name = class_import_name(recipe)
    assert "." not in name and ":" not in name
    assert recipe_of_import_name(name) == recipe
    assert recipe_of_import_name("leg_counting") is None and recipe_of_import_name("recipe_%%%") is None


@pytest.mark.skipif(importlib.util.find_spec("openenv") is not None, reason="the openenv extra is installed here")
def test_a_source_whose_extra_is_missing_says_what_to_install() -> None:
    done = subprocess.run([sys.executable, "-m", "ors_grpc.cli", "serve", "--port", "0", "openenv:pkg.env:MyEnv"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    # This virtualenv has the checkout installed editable: the command adds the extra to it (as for --mcp-port).
    assert done.stderr.strip().endswith(f"(install the extra: pip install -e '{ROOT}[openenv]')"), done.stderr
    assert len(done.stderr.splitlines()) == 1, done.stderr


def test_a_spec_with_an_unknown_source_is_a_module_path() -> None:
    done = subprocess.run([sys.executable, "-m", "ors_grpc.cli", "serve", "--port", "0", "no-such-source:Thing"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot import 'no-such-source'" in done.stderr, done.stderr


def test_serve_help_lists_the_installed_sources_and_their_syntax() -> None:
    done = subprocess.run([sys.executable, "-m", "ors_grpc.cli", "serve", "--help"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0
    sources = done.stdout.split("environment sources, each with the extra of its name")[1]
    assert "\n  reasoning-gym:DATASET[+DATASET...][,...][?split=NAME:SIZE:SEED&...&PARAM=VALUE...]\n" in sources
    assert "\n  openenv:MODULE:CLASS[?...] | openenv:URL[?...]\n" in sources
