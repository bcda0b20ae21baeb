"""The heartbeat's GPU figures read the plan's devices, UUIDs included, through NVML. No GPU
here: a stand-in for the pynvml module (the one place a fake is needed)."""

from types import SimpleNamespace

from conftest import node
from entrypoint.plan.node_plan import make_plan
from entrypoint.supervise.gpu_stats import Stats

MIB = 1 << 20


class FakeNvml:
    """pynvml's calls that Stats makes, over a machine of three GPUs and one MIG instance."""

    GPUS = {
        "0": "GPU-0000",
        "1": "GPU-0001",
        "2": "GPU-0002",
    }

    def __init__(self) -> None:
        self.initialized = False
        self.by_uuid = {"MIG-dddd": ("mig", 7)} | {
            uuid: (index, 10 * int(index)) for index, uuid in self.GPUS.items()
        }

    def nvmlInit(self) -> None:
        self.initialized = True

    def nvmlDeviceGetHandleByIndex(self, index: int):
        return (str(index), 10 * index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str):
        return self.by_uuid[uuid]

    def nvmlDeviceGetUtilizationRates(self, handle):
        return SimpleNamespace(gpu=handle[1])

    def nvmlDeviceGetMemoryInfo(self, handle):
        return SimpleNamespace(used=handle[1] * MIB, total=80 * 1024 * MIB)


def test_indices_and_uuids_map_to_their_handles():
    nvml = FakeNvml()
    stats = Stats(("2", "GPU-0001", "MIG-dddd"), nvml=nvml)
    assert nvml.initialized
    assert [g.util for g in stats.read().gpus] == [20, 10, 7]


def test_the_plan_decides_which_gpus_are_read():
    plan = make_plan({"CUDA_VISIBLE_DEVICES": "GPU-0002,GPU-0000"}, node(3))
    assert plan.devices == ("GPU-0002", "GPU-0000")
    assert plan.cuda_visible_devices == "GPU-0002,GPU-0000"
    figures = Stats(plan.devices, nvml=FakeNvml()).read().gpus
    assert [g.util for g in figures] == [20, 0]


def test_without_gpus_the_cpu_load():
    read = Stats((), nvml=FakeNvml()).read()
    assert read.gpus == () and read.load is not None
