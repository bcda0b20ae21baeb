"""Rendered manifests against the real schemas: Kubernetes' own (kubernetes-validate, which ships
them, so this runs offline) and the CRDs' openAPIV3Schema in tests/schemas (header of each file:
repository, path, tag and commit). Unknown fields are refused, as `kubectl apply` does with its
default --validate=strict, and each schema is shown to refuse a broken manifest.
"""

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from render_cases import rendered

SCHEMAS = Path(__file__).parents[1] / "schemas"
# The oldest Kubernetes the specs are meant for (Indexed Jobs are GA from 1.24), and the newest
# kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.27", latest_version())
CRDS = {"PyTorchJob": "pytorchjob.yaml", "TrainJob": "trainjob.yaml", "Job": "volcano-job.yaml"}
CASES = {"PyTorchJob": "pytorchjob.yaml", "TrainJob": "trainjob.yaml", "Job": "volcano.yaml"}


def strict(schema):
    """No field the schema does not name, unless it keeps unknown fields or is a map."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


def crd_validator(kind: str) -> jsonschema.Draft7Validator:
    schema = yaml.load((SCHEMAS / CRDS[kind]).read_text(), Loader=yaml.CSafeLoader)
    return jsonschema.Draft7Validator(strict(schema))


def documents(case: str) -> list[dict]:
    return list(yaml.safe_load_all(rendered(case)))


def kubernetes_errors(document: dict) -> list[str]:
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            errors.append(f"{version}: {'.'.join(map(str, err.path))}: {err.message}")
    return errors


@pytest.mark.parametrize("document", documents("kubernetes.yaml"), ids=lambda d: d["kind"])
def test_kubernetes_objects_validate(document):
    assert kubernetes_errors(document) == []


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("spec", "completions"), "two"),
        (("spec", "template", "spec", "containers", 0, "imagePullPolicyy"), "Always"),
        (("spec", "template", "spec", "volumes", 0, "emptyDir", "medium"), ["Memory"]),
    ],
)
def test_kubernetes_schema_refuses_a_broken_job(path, value):
    job = copy.deepcopy(documents("kubernetes.yaml")[1])
    target = job
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert kubernetes_errors(job), f"a Job with {'.'.join(map(str, path))}={value!r} validated"


@pytest.mark.parametrize("kind", sorted(CRDS))
def test_crd_objects_validate(kind):
    (document,) = documents(CASES[kind])
    assert document["kind"] == kind
    errors = [
        f"{'.'.join(map(str, e.path))}: {e.message}"
        for e in crd_validator(kind).iter_errors(document)
    ]
    assert errors == []


# One break per CRD in the part the renderer writes: a wrong type, and a misspelt field.
BROKEN = {
    "PyTorchJob": [
        (("spec", "pytorchReplicaSpecs", "Master", "replicas"), "one"),
        (("spec", "nprocPerNod"), "8"),
    ],
    "TrainJob": [
        (("spec", "trainer", "numNodes"), "2"),
        (
            (
                "spec",
                "runtimePatches",
                0,
                "trainingRuntimeSpec",
                "template",
                "spec",
                "replicatedJobs",
                0,
                "template",
                "spec",
                "template",
                "spec",
                "hostNetwork",
            ),
            True,
        ),
    ],
    "Job": [(("spec", "tasks", 0, "replicas"), "1"), (("spec", "plugin"), {"svc": []})],
}


@pytest.mark.parametrize(
    ("kind", "path", "value"),
    [(kind, path, value) for kind, cases in BROKEN.items() for path, value in cases],
)
def test_crd_schema_refuses_a_broken_manifest(kind, path, value):
    (document,) = documents(CASES[kind])
    target = document
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    assert not crd_validator(kind).is_valid(document), f"{kind} with {path}={value!r} validated"


def test_stored_schemas_name_their_origin():
    for name in CRDS.values():
        head = (SCHEMAS / name).read_text().splitlines()[:3]
        assert head[0].startswith("# openAPIV3Schema of ") and "(commit " in head[1]
