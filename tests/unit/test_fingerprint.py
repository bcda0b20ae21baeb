"""fingerprint.packages(): the same answer as importlib.metadata, read from the header lines only
(the join's cost at 2, 8 and 32 nodes: benchmarks/preflight.py)."""

from importlib import metadata

from entrypoint.supervise.probe import packages


def test_same_as_importlib_metadata_first_found_wins():
    expected: dict[str, str] = {}
    for dist in metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if name and name not in expected:
            expected[name] = dist.version
    assert packages() == dict(sorted(expected.items()))


def test_dist_info_and_egg_info_headers_only(tmp_path):
    (tmp_path / "Tiny_Pkg-1.2.dist-info").mkdir()
    (tmp_path / "Tiny_Pkg-1.2.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: Tiny_Pkg\nVersion: 1.2\n\nName: not-a-header\n"
    )
    (tmp_path / "old.egg-info").write_text("Metadata-Version: 1.0\nName: old\nVersion: 0.1\n")
    (tmp_path / "broken.dist-info").mkdir()  # no METADATA: skipped
    later = tmp_path / "later"
    later.mkdir()
    (later / "tiny_pkg-9.9.dist-info").mkdir()
    (later / "tiny_pkg-9.9.dist-info" / "METADATA").write_text("Name: tiny-pkg\nVersion: 9.9\n")
    assert packages([str(tmp_path), str(later), str(tmp_path / "missing")]) == {
        "old": "0.1",
        "tiny-pkg": "1.2",
    }
