"""How `make test` deals the tests to its processes (tests/conftest.py loads it and orders the
collection by expected_seconds): the unit tests a test at a time, the longest first
(LONGEST_FIRST); the container tests a file at a time (`--dist loadfile`: a file's tests share
its module's fixtures, a derived image, a SLURM image), the files whose tests take longest
together first (FILES_FIRST), then the users' trainers a case at a time (CASE_AT_A_TIME).
tests/unit/test_schedule.py runs it."""

from __future__ import annotations

# The tests that mostly wait, longest first: their mean seconds per test (`make test-profile`,
# 2026-12-06, docs/testing.md). The unit tests' processes take a test at a time in this order
# (`--dist load --maxschedchunk 1`), so no long test starts last and holds the run open.
LONGEST_FIRST = {
    "unit/test_hang_real.py::test_with_no_setting_the_learned_timeout": 192,
    "unit/test_hang_real.py::test_with_no_setting_a_rank_half_a_second_slower": 150,
    "unit/test_hang_real.py": 40,
    "unit/test_allreduce_real.py": 24,
    "unit/test_spares_real.py": 17,
    "unit/test_health_real.py": 15,
    "unit/test_status_real.py": 12,
    "unit/test_supervise_real.py": 9,
    "unit/test_run_real.py": 7,
    "unit/test_control_real.py": 7,
    "unit/test_benchmarks.py": 5,
    "unit/test_world_check.py": 4,
    "unit/test_exit_guard.py": 6,
    "unit/test_launch_lines.py": 1.4,
    # ... and the other tests that wait most, each by itself (tests/unit's, 2026-12-06: wall
    # seconds with 5 processes on 2 cores), which would otherwise come last in the file order
    "unit/test_render_hostile.py::test_any_arguments_read_back_from_every_manifest": 30,
    "unit/test_hostile.py::test_doctor_and_run_refuse_the_same_way": 19,
    "unit/test_doctor.py::test_gpus_promised_but_not_seen": 19,
    "unit/test_rank_progress.py::test_the_site_hook_counts_forward_passes": 15,
    "unit/test_rank_progress.py::test_each_rank_answers_with_its_recorder": 12,
    "unit/test_rank_progress.py::test_the_site_hook_reports_steps_saves": 12,
    "unit/test_supervise_parts.py::test_the_rank_that_failed_first": 12,
    "unit/test_supervise_parts.py::test_the_crash_is_named_when_it_exits_after": 12,
    "unit/test_worker_output.py::test_two_workers_lines_never_mix": 12,
    "unit/test_doctor.py::test_json_exit_code_follows_the_problems": 9,
    "unit/test_schedule.py::test_a_real_run": 9,
    "unit/test_rank_progress.py::test_without_the_entrypoint_the_hook_costs": 8,
    "unit/test_render_hostile.py::test_any_arguments_reach_the_command": 8,
    "unit/test_supervise_parts.py::test_the_crash_is_named_when_it_wrote_last": 7,
    "unit/test_control_fuzz.py": 4,
    # node 0 killed under a user's trainer: 3 nodes and a restart (CI's run of 2026-12-07: 64 s)
    "compat/test_compat.py::test_a_users_trainer_resumes_after_node_0_is_lost": 64,
    "compat/test_compat.py": 43,  # each case goes alone (CASE_AT_A_TIME)
}
# The container tests go a file to a process (`--dist loadfile`: a file's tests share its
# module's fixtures, a derived image, a SLURM image), the files whose tests take longest together
# first: the seconds of each file's tests together (CI's run of 2026-12-06, 4 processes side by
# side), so that no long file starts last and holds the run open. Then the users' trainers, a
# case at a time (CASE_AT_A_TIME).
FILES_FIRST = {
    "cluster/test_faults.py": 550,
    "cluster/test_spares.py": 370,
    "cluster/test_ranks.py": 270,  # with its JAX cases (2026-12-06, stop 65: about 155 s more)
    "cluster/test_preflight.py": 230,
    "image/test_job.py": 200,
    "cluster/test_control.py": 180,
    "image/test_benchmarks.py": 160,
    "cluster/test_ipv6.py": 150,
    "image/test_deepspeed_ops.py": 130,
    "cluster/test_local.py": 130,
    "cluster/test_metrics.py": 72,
    "image/test_image.py": 66,
    "image/test_users_code.py": 52,
    "cluster/test_cluster.py": 50,
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


def expected_seconds(nodeid: str) -> float:
    """A test's seconds, or those of its whole file where the file goes to one process."""
    table = FILES_FIRST if any(key in nodeid for key in FILES_FIRST) else LONGEST_FIRST
    return next((s for key, s in table.items() if key in nodeid), 0.0)
