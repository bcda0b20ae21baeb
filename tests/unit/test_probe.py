"""The GPU probe keeps NVML's own words: a driver/library mismatch is not 'no driver'."""

import pynvml
import pytest

from entrypoint import probe


@pytest.mark.parametrize(
    "code,words",
    [
        (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "version mismatch"),
        (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
        (pynvml.NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    ],
)
def test_nvml_errors_are_named(code, words):
    assert words in probe._nvml_reason(pynvml.NVMLError(code))
