"""Host paths in arguments: under an allowed folder, checked without looking at the host."""

from pathlib import Path

from brokerd.tools.paths import PlacedPaths, place_paths

ROOTS = (Path("/srv/ws"), Path("/srv/other"))


def test_a_path_under_a_root_is_normalised_and_its_root_kept() -> None:
    placed = place_paths(["repo"], {"repo": "/srv/ws/s1/./repo/", "n": 3}, ROOTS)
    assert placed == PlacedPaths({"repo": "/srv/ws/s1/repo", "n": 3}, (Path("/srv/ws"),))


def test_a_path_that_climbs_out_is_refused_with_the_allowed_folders() -> None:
    refused = place_paths(["repo"], {"repo": "/srv/ws/../../home/admin/repo"}, ROOTS)
    assert refused == "repo must be a path under /srv/ws, /srv/other"


def test_the_answer_is_the_same_for_a_path_that_exists_and_one_that_does_not() -> None:
    # /usr exists on every host, the other path nowhere: the refusal must not tell them apart.
    assert place_paths(["repo"], {"repo": "/usr"}, ROOTS) == place_paths(
        ["repo"], {"repo": "/nonexistent-7f3a"}, ROOTS
    )


def test_a_relative_path_and_no_roots_are_refused() -> None:
    assert place_paths(["repo"], {"repo": "srv/ws/x"}, ROOTS) == (
        "repo must be an absolute path under /srv/ws, /srv/other"
    )
    refused = place_paths(["repo"], {"repo": "/srv/ws/x"}, ())
    assert isinstance(refused, str)
    assert "host_path_roots is empty" in refused


def test_a_prefix_that_is_not_a_parent_does_not_count() -> None:
    assert isinstance(place_paths(["repo"], {"repo": "/srv/wsx/repo"}, ROOTS), str)
