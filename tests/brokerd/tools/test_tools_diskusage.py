"""host_disk_usage: the host's mount table and statvfs, formatted like df -h -P."""

from brokerd.tools.diskusage import DiskUsage, Mounted, format_table, human, parse_mounts

MOUNTS = """\
/dev/vda1 / ext4 rw,relatime 0 0
proc /proc proc rw 0 0
tmpfs /run tmpfs rw 0 0
/dev/vdb /srv/my\\040data xfs rw 0 0
/dev/vda1 / ext4 rw 0 0
"""


def test_virtual_file_systems_and_repeated_mount_points_are_left_out() -> None:
    assert parse_mounts(MOUNTS) == [
        Mounted("/dev/vda1", "/", "ext4"),
        Mounted("/dev/vdb", "/srv/my data", "xfs"),
    ]


def test_sizes_read_like_df_h() -> None:
    assert [human(n) for n in (512, 2048, 15 * 1024**2, 252 * 1024**3)] == [
        "512",
        "2.0K",
        "15M",
        "252G",
    ]


def test_the_table_has_dfs_columns() -> None:
    gib = 1024**3
    table = format_table([DiskUsage("/dev/vda1", "/", 100 * gib, 25 * gib, 75 * gib)])
    assert table.splitlines() == [
        "Filesystem Size Used Avail Use% Mounted on",
        "/dev/vda1  100G  25G   75G  25% /",
    ]
