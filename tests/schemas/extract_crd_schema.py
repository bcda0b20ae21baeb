"""Write the openAPIV3Schema of one CRD version, descriptions removed, with a header naming its
origin. The CRD YAMLs are large (0.2-0.6 MB) and mostly descriptions, which validation never reads.

    git -C <clone> show <commit>:<path> | python tests/schemas/extract_crd_schema.py \
        --repo <owner/name> --path <path> --commit <commit> --tag <tag> > tests/schemas/<kind>.yaml
"""

from __future__ import annotations

import argparse
import sys

import yaml


def strip_descriptions(schema, *, property_names: bool = False):
    """Drop the `description` keyword, but not a property that happens to be named description."""
    if isinstance(schema, dict):
        return {
            key: strip_descriptions(
                value, property_names=(key == "properties" and not property_names)
            )
            for key, value in schema.items()
            if property_names or key != "description"
        }
    if isinstance(schema, list):
        return [strip_descriptions(item) for item in schema]
    return schema


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--repo", "--path", "--commit", "--tag"):
        parser.add_argument(name, required=True)
    parser.add_argument("--version", help="the CRD version to keep (default: the stored one)")
    args = parser.parse_args()
    crd = yaml.load(sys.stdin.read(), Loader=yaml.CSafeLoader)
    versions = crd["spec"]["versions"]
    chosen = next(
        v
        for v in versions
        if v["name"] == args.version or (args.version is None and v.get("storage"))
    )
    kind = crd["spec"]["names"]["kind"]
    schema = strip_descriptions(chosen["schema"]["openAPIV3Schema"])
    group = crd["spec"]["group"]
    print(
        f"# openAPIV3Schema of {group}/{chosen['name']} {kind}, descriptions removed.\n"
        f"# From {args.repo}, {args.path} at {args.tag} (commit {args.commit}).\n"
        f"# Regenerate: see tests/schemas/extract_crd_schema.py."
    )
    print(yaml.dump(schema, Dumper=yaml.CSafeDumper, sort_keys=True, width=1000), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
