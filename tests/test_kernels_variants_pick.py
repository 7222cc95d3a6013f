"""bench --pick-variant: the main table runs the tuning its variants run found fastest over every case."""
import pytest

from policies.kernels import bench
from policies.kernels.variants import VARIANTS, fastest


def rows(variant, totals):
    cases = [("reconstruct", "1,1,1", 4, 128), ("reconstruct_deferred", "1,1,1", 4, 128), ("reconstruct", "chain", 64, 64)]
    return [dict(variant=variant, policy=p, tree=t, T=T, B=B, total_us=us) for (p, t, T, B), us in zip(cases, totals)]


def test_fastest_sums_over_cases_and_skips_a_variant_cut_short():
    got = fastest(rows("default", [300, 350, 600]) + rows("chain", [250, 200, 600])
                  + rows("sparse", [300, 350, 601]) + rows("chain-max4", [100, 100]))  # no chain-64 row: not eligible
    assert got == ("chain", {"chain": 1050.0, "default": 1250.0, "sparse": 1251.0})
    # a fast case cannot win by the others' absence, and ties keep the first timed
    assert fastest(rows("a", [1, 1, 1]) + rows("b", [1, 1, 1]))[0] == "a"
    with pytest.raises(ValueError, match="no variant was timed"):
        fastest([])


def test_pick_variant_needs_a_variants_run(capsys):
    for argv in (["--pick-variant"], ["--pick-variant", "--variants", "chain", "--tuning", "chain=true"]):
        with pytest.raises(SystemExit) as exc:
            bench.main(["--out", "unused", *argv])
        assert exc.value.code == 2 and "--pick-variant needs --variants" in capsys.readouterr().err
    assert {"chain-max4-sparse", "chain-max16-sparse"} <= set(VARIANTS)
    assert VARIANTS["chain-max16-sparse"].chain_max == 16 and VARIANTS["chain-max16-sparse"].sparse
