"""How `make test` deals the container tests to its processes (tests/conftest.py loads it):
a file at a time (`--dist loadfile`: a file's tests share its module's fixtures, a derived image,
a SLURM image), the files whose tests take longest together first (FILES_FIRST, by which
tests/conftest.py orders the collection), then the users' trainers a case at a time
(CASE_AT_A_TIME). tests/unit/test_schedule.py runs it."""

from __future__ import annotations

# The container tests go a file to a process (`--dist loadfile`: a file's tests share its
# module's fixtures, a derived image, a SLURM image), the files whose tests take longest together
# first: the seconds of each file's tests together (CI's run of 2026-12-06, 4 processes side by
# side), so that no long file starts last and holds the run open. Then the users' trainers, a
# case at a time (CASE_AT_A_TIME).
FILES_FIRST = {
    "cluster/test_faults.py": 550,
    "cluster/test_spares.py": 370,
    "cluster/test_preflight.py": 230,
    "image/test_deepspeed_ops.py": 220,
    "cluster/test_local.py": 210,
    "image/test_job.py": 200,
    "cluster/test_control.py": 180,
    "image/test_benchmarks.py": 160,
    "cluster/test_ipv6.py": 150,
    "cluster/test_ranks.py": 115,
    "cluster/test_cluster.py": 95,
    "cluster/test_metrics.py": 72,
    "image/test_image.py": 66,
    "image/test_users_code.py": 52,
}


# Files whose cases go to whichever process is free, one at a time, under `--dist loadfile`:
# each case is a job of its own, and the file is the longest (its module fixture, the derived
# Lightning image, is built under a tag of each process's own).
CASE_AT_A_TIME = ("compat/test_compat.py",)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, with CASE_AT_A_TIME's cases each a unit of work of its own. (xdist's
    `loadgroup` would say it with marks, but it renames the tests to do so, which pytest 9's
    node ids no longer allow: every test went alone.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileOrCase(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return FileOrCase(config, log)


def work_unit(nodeid: str) -> str:
    """The unit of work a test goes to a process in: its file, or itself in CASE_AT_A_TIME."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path.endswith(CASE_AT_A_TIME) else path
