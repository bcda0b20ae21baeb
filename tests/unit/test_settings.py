import pytest

from entrypoint.plan.errors import ConfigError
from entrypoint.plan.settings import Settings, given_env, markdown_table


def test_reads_only_the_given_mapping(monkeypatch):
    monkeypatch.setenv("ENTRYPOINT_NNODES", "7")
    assert Settings.from_env({}).nnodes is None
    assert Settings.from_env({"ENTRYPOINT_NNODES": "3"}).nnodes == 3


def test_empty_means_unset():
    assert Settings.from_env({"ENTRYPOINT_NNODES": " "}).nnodes is None


@pytest.mark.parametrize(
    ("env", "start"),
    [
        ({"ENTRYPOINT_NNODES": "abc"}, "ENTRYPOINT_NNODES='abc': "),
        ({"ENTRYPOINT_MASTER_PORT": "70000"}, "ENTRYPOINT_MASTER_PORT='70000': "),
        ({"ENTRYPOINT_DEVICE": "tpu"}, "ENTRYPOINT_DEVICE='tpu': "),
        ({"ENTRYPOINT_NPROC_PER_NODE": "0"}, "ENTRYPOINT_NPROC_PER_NODE='0': "),
    ],
)
def test_bad_values_one_line(env, start):
    with pytest.raises(ConfigError) as err:
        Settings.from_env(env)
    assert err.value.line().startswith(start) and "\n" not in err.value.line()


def test_markdown_table_lists_every_setting():
    table = markdown_table()
    for name in Settings.model_fields:
        assert f"`ENTRYPOINT_{name.upper()}`" in table


def test_the_env_source_reads_the_given_mapping(monkeypatch):
    """The prefix taken off, over the mapping given, stripped, a blank value unset; pydantic
    parses; os.environ is not read."""
    monkeypatch.setenv("ENTRYPOINT_JOB", "jax")
    given = {"ENTRYPOINT_NNODES": " 3 ", "ENTRYPOINT_RUN_DIR": " ", "NNODES": "9"}
    assert given_env(given) == {"nnodes": "3"}
    settings = Settings.from_env(given)
    assert settings.nnodes == 3 and settings.job == "deepspeed"
    assert settings.stated() == {"nnodes": 3}


def test_names_are_read_as_the_environment_spells_them():
    """Linux environment names are case-sensitive: entrypoint_nnodes is another variable."""
    assert Settings.from_env({"entrypoint_nnodes": "3"}).nnodes is None
    assert Settings.from_env({"Entrypoint_Nnodes": "3"}).nnodes is None
    assert Settings.from_env({"ENTRYPOINT_NNODES": "3"}).nnodes == 3
