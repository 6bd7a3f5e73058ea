"""The default and exhaustive tiers (tests/tiers.py): one variant per models/ module by
default, every other one exhaustive, nothing dropped."""

from models import registry
from tests import tiers


def test_the_default_tier_holds_one_variant_of_every_module():
    names = registry.available()
    chosen = tiers.representatives(names)
    assert sorted(registry.module_of(n) for n in chosen) == sorted(
        {registry.module_of(n) for n in names})
    assert {"transformer", "gated_deltanet", "gla"} <= chosen  # PREFERRED wins


def test_preferred_names_are_registered_and_of_distinct_modules():
    assert set(tiers.PREFERRED) <= set(registry.available())
    modules = [registry.module_of(n) for n in tiers.PREFERRED]
    assert len(set(modules)) == len(modules)


def test_variants_marks_every_other_name_exhaustive_and_keeps_the_order():
    names = ["local", "transformer", "bigbird", "gla", "retnet", "s5"]
    params = tiers.variants(names)
    plain = [p for p in params if isinstance(p, str)]
    marked = [p.values[0] for p in params if not isinstance(p, str)]
    assert plain == ["transformer", "gla", "s5"]
    assert marked == ["local", "bigbird", "retnet"]
    assert all(p.marks == (tiers.EXHAUSTIVE,) for p in params if not isinstance(p, str))
    # A subset without the module's preferred name keeps its alphabetically first member.
    assert tiers.variants(["local", "bigbird"])[0].values == ("local",)  # exhaustive
    assert tiers.variants(["local", "bigbird"])[1] == "bigbird"


def test_the_exhaustive_marker_is_registered_and_left_out_by_default(pytestconfig):
    assert any(m.startswith("exhaustive:") for m in pytestconfig.getini("markers"))
    assert "not exhaustive" in " ".join(pytestconfig.getini("addopts"))


def test_cases_keep_each_variants_main_setting_in_its_tier():
    params = tiers.cases(["a", "b"], lambda n: "b" if n == "gla" else "a",
                         names=["transformer", "local", "gla"])
    got = {p.values: [m.name for m in p.marks] for p in params}
    assert got == {("transformer", "a"): [], ("transformer", "b"): ["exhaustive"],
                   ("local", "a"): ["exhaustive"], ("local", "b"): ["exhaustive"],
                   ("gla", "a"): ["exhaustive"], ("gla", "b"): []}
