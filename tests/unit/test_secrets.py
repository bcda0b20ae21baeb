"""Which variables are secrets: by name, so that settings that merely contain a marker
(TOKENIZERS_PARALLELISM) are not masked everywhere their value appears."""

import pytest

from entrypoint.plan.secrets import is_secret, mask, secret_values


@pytest.mark.parametrize(
    "name",
    [
        "HF_TOKEN",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "GITHUB_TOKEN",
        "MY_API_KEY",
        "DB_PASSWORD",
        "MY_SECRET",
        "NGC_API_KEY",
        "OPENAI_API_KEY",
        "hf_token",
        "AZURE_STORAGE_CONNECTION_STRING",
        "TOKEN",
        "API_KEY",
        "REDIS_PASSWD",
        "SOME_APIKEY",
    ],
)
def test_credentials_are_secrets(name):
    assert is_secret(name)


@pytest.mark.parametrize(
    "name",
    [
        "TOKENIZERS_PARALLELISM",
        "NCCL_IB_PKEY",
        "KEYRING_BACKEND",
        "SSH_KEYGEN_OPTS",
        "PASSWORD_STORE_DIR",
        "SECRETS_DIR_HINT",
        "MONKEY_PATCH",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
        "AWS_ACCESS_KEY_ID",
        "HF_TOKEN_PATH",
        "KEY",
        "TOKEN_LIMIT",
    ],
)
def test_settings_that_contain_a_marker_are_not(name):
    assert not is_secret(name)


def test_a_setting_like_tokenizers_parallelism_leaves_its_value_alone():
    env = {"TOKENIZERS_PARALLELISM": "false", "HF_TOKEN": "hf_abcdef123", "WANDB_API_KEY": "k3y"}
    values = secret_values(env)
    assert values == ("hf_abcdef123",)  # 3 characters are too short to mask safely
    assert mask("parallel=false token=hf_abcdef123", values) == "parallel=false token=***"
