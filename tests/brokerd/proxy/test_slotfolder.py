"""The save folder's cap: this client's files (those it forwarded a save of), least recently used
first, until under the cap; another client's files, of loopd's shape or not, are never touched."""

import os
from pathlib import Path

import anyio

from brokerd.proxy.slotfolder import SavedFile, SlotFolder, evictions, superseded
from loopcommon.slotfiles import slot_file_name

FINGERPRINT = "0123456789ab"  # the model that wrote a save (loopcommon.slotfiles)


def saved(name: str, size: int, used_ns: int) -> SavedFile:
    return SavedFile(Path(name), size, used_ns)


def test_the_least_recently_used_go_first_until_under_the_cap() -> None:
    files = [saved("new", 40, 3), saved("old", 40, 1), saved("mid", 40, 2)]
    assert [f.path.name for f in evictions(files, 100)] == ["old"]
    assert [f.path.name for f in evictions(files, 80)] == ["old"]
    assert [f.path.name for f in evictions(files, 79)] == ["old", "mid"]
    assert evictions(files, 120) == []


def test_a_file_alone_over_the_cap_goes_too() -> None:
    assert [f.path.name for f in evictions([saved("big", 200, 1)], 100)] == ["big"]


def write(folder: Path, session: str, size: int, used_s: int, prefix: bytes = b"") -> Path:
    path = folder / slot_file_name(session, prefix or session.encode(), fingerprint=FINGERPRINT)
    path.write_bytes(b"\0" * size)
    os.utime(path, ns=(used_s * 10**9, used_s * 10**9))
    return path


def forwarded(folder: SlotFolder, *paths: Path) -> SlotFolder:
    """``folder`` once it has forwarded a save of each of ``paths``."""
    for path in paths:
        folder.forwarded_now(path.name)
    return folder


def test_the_folder_keeps_other_clients_files_and_counts_several_folders(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    oldest = write(one, "a", 1000, 100)
    middle = write(two, "b", 1000, 200)
    newest = write(one, "c", 1000, 300)
    theirs = one / "someone-elses.bin"
    theirs.write_bytes(b"\0" * 5000)
    folder = forwarded(SlotFolder((one, two), max_bytes=2000), oldest, middle, newest)
    removed = folder.evict_now()
    assert [file.path for file in removed] == [oldest]
    assert not oldest.exists()
    assert middle.exists()
    assert newest.exists()
    assert theirs.exists()


def test_a_restore_makes_its_file_the_last_to_go(tmp_path: Path) -> None:
    older = write(tmp_path, "a", 1000, 100)
    newer = write(tmp_path, "b", 1000, 200)
    folder = forwarded(SlotFolder((tmp_path,), max_bytes=1500), older, newer)
    anyio.run(folder.used, older.name)
    folder.evict_now()
    assert older.exists()
    assert not newer.exists()


def test_a_missing_folder_is_logged_not_fatal(tmp_path: Path) -> None:
    folder = SlotFolder((tmp_path / "absent",), max_bytes=1)
    assert folder.evict_now() == []
    folder.mark_used(slot_file_name("a", b"a", fingerprint=FINGERPRINT))


def test_before_a_save_room_is_made_for_one_more_state(tmp_path: Path) -> None:
    older = write(tmp_path, "a", 1000, 100)
    newer = write(tmp_path, "b", 1000, 200)
    folder = forwarded(SlotFolder((tmp_path,), max_bytes=2500), older, newer)
    assert folder.evict_now() == []
    assert [file.path for file in folder.evict_now(room_for_one=True)] == [older]
    assert newer.exists()


def test_a_new_save_supersedes_only_the_same_sessions_other_files() -> None:
    newest = slot_file_name("a", b"a: three turns", fingerprint=FINGERPRINT)
    files = [
        saved(slot_file_name("a", b"a: one turn", fingerprint=FINGERPRINT), 10, 1),
        saved(slot_file_name("a", b"a: two turns", fingerprint=FINGERPRINT), 20, 2),
        saved(newest, 30, 3),
        saved(slot_file_name("b", b"b: one turn", fingerprint=FINGERPRINT), 10, 1),
        saved("someone-elses.bin", 10, 1),
    ]
    assert [f.path.name for f in superseded(files, newest)] == [
        slot_file_name("a", b"a: one turn", fingerprint=FINGERPRINT),
        slot_file_name("a", b"a: two turns", fingerprint=FINGERPRINT),
    ]
    assert superseded(files, "not-of-loopds-shape.bin") == []


def test_after_a_save_the_sessions_earlier_files_are_removed(tmp_path: Path) -> None:
    earlier = tmp_path / slot_file_name("a", b"a: one turn", fingerprint=FINGERPRINT)
    earlier.write_bytes(b"\0" * 100)
    latest = tmp_path / slot_file_name("a", b"a: two turns", fingerprint=FINGERPRINT)
    latest.write_bytes(b"\0" * 100)
    other = write(tmp_path, "b", 100, 100)
    folder = forwarded(SlotFolder((tmp_path,), max_bytes=10_000), earlier, latest, other)

    async def saved() -> None:
        await folder.save_answered(latest.name, succeeded=True)

    anyio.run(saved)
    assert not earlier.exists()
    assert latest.exists()
    assert other.exists()


def test_another_clients_files_of_loopds_shape_are_neither_counted_nor_removed(
    tmp_path: Path,
) -> None:
    theirs = write(tmp_path, "a", 5000, 1, b"their turn")  # the same session as ours
    ours = write(tmp_path, "a", 1000, 2, b"our turn")
    folder = forwarded(SlotFolder((tmp_path,), max_bytes=1500), ours)
    assert folder.evict_now(room_for_one=False) == []  # theirs does not count
    assert folder.supersede_now(ours.name) == []
    assert theirs.exists()
    before = theirs.stat().st_mtime_ns
    folder.mark_used(theirs.name)
    assert theirs.stat().st_mtime_ns == before  # not even stamped


def test_the_ledger_outlives_brokerd_and_forgets_what_is_gone(tmp_path: Path) -> None:
    ours = write(tmp_path, "a", 1000, 1)
    gone = write(tmp_path, "b", 1000, 2)
    forwarded(SlotFolder((tmp_path,), max_bytes=5000, client="box"), ours, gone)
    gone.unlink()
    again = SlotFolder((tmp_path,), max_bytes=5000, client="box")  # brokerd started again
    assert [file.path for file in again.saved_files()] == [ours]
    assert again.names == {ours.name}
    other_client = SlotFolder((tmp_path,), max_bytes=5000, client="another box")
    assert other_client.names == frozenset()


def test_a_ledger_brokerd_did_not_write_is_left_with_its_files(tmp_path: Path) -> None:
    ours = write(tmp_path, "a", 1000, 1)
    folder = forwarded(SlotFolder((tmp_path,), max_bytes=1), ours)
    folder.ledger.write_bytes(b"\x00 a slot state another client saved under this name")
    again = SlotFolder((tmp_path,), max_bytes=1)
    assert again.names == frozenset()
    assert again.evict_now() == []
    assert ours.exists()


def test_a_moved_sessions_save_is_copied_from_the_other_servers_folder(tmp_path: Path) -> None:
    here, there, theirs_dir = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (here, there, theirs_dir):
        folder.mkdir()
    saved_there = write(there, "moved", 300, 100)
    saved_there.write_bytes(b"the state")
    theirs = write(theirs_dir, "another client's", 300, 100)
    mine = SlotFolder((here,), max_bytes=10_000)
    peer = forwarded(SlotFolder((there,), max_bytes=10_000), saved_there)
    stranger = SlotFolder((theirs_dir,), max_bytes=10_000, client="another client")
    mine.peers = [peer, stranger]
    anyio.run(mine.restoring, saved_there.name)
    assert (here / saved_there.name).read_bytes() == b"the state"
    assert saved_there.name in mine.names  # this server's folder keeps it under its cap now
    assert saved_there.exists()  # the other server's copy is its own to keep or evict
    anyio.run(mine.restoring, theirs.name)  # not a file this client forwarded: never copied
    assert not (here / theirs.name).exists()
    assert not list(here.glob(".*.copy"))


def test_a_folder_both_servers_save_into_is_not_copied_into_itself(tmp_path: Path) -> None:
    shared = write(tmp_path, "moved", 300, 100)
    mine = SlotFolder((tmp_path,), max_bytes=10_000, client="infer-b")
    mine.peers = [forwarded(SlotFolder((tmp_path,), max_bytes=10_000, client="infer-a"), shared)]
    assert mine.copy_from_peer(shared.name) == shared
    assert shared.name in mine.names
