"""Stage tracks (analysis/stage_tracks): (pid, tid) pairs are numbered as a pandas MultiIndex factorize does."""

from __future__ import annotations


def test_pairs_factorized_as_a_multiindex_does() -> None:
    import numpy as np
    import pandas as pd

    from profparse.analysis.stage_tracks import _factorize_pairs

    rng = np.random.default_rng(7)
    pid = rng.choice(np.array([3, -1, 2_910_249, 7], dtype=np.int64), 5000)
    tid = rng.choice(np.array([-549_452_224, 1, 2**40, 5, 1], dtype=np.int64), 5000)
    codes, pairs = _factorize_pairs(pid, tid)
    want_codes, want = pd.MultiIndex.from_arrays([pid, tid]).factorize()
    assert codes.tolist() == want_codes.tolist() and pairs == [tuple(int(v) for v in p) for p in want]
    assert [pairs[c] for c in codes[:50]] == list(zip(pid[:50].tolist(), tid[:50].tolist(), strict=True))
    assert _factorize_pairs(np.array([], np.int64), np.array([], np.int64))[1] == []
