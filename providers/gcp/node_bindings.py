"""One node's bindings on its run's bucket, in IAM Conditions' terms (issue 29).

Each node id of a run has its own service account (identity.py). Its bindings on the run's
bucket (uniform bucket-level access) are, since IAM allow policies only add up (no binding can
deny):

- reads: `roles/storage.objectViewer` (storage.objects.get and .list) on the run's objects but
  the run's key (`control/key`), and on listings inside the run's prefix, the same condition
  for every node of the run (one binding, every node's account a member of it):

      (resource.name.startsWith("projects/_/buckets/B/objects/P")
        && !resource.name.startsWith("projects/_/buckets/B/objects/Pcontrol/key"))
      || api.getAttribute("storage.googleapis.com/objectListPrefix", "").startsWith("P")

- writes: `roles/storage.objectAdmin` (create, delete -- which replacing an object needs too
  --, update and the multipart-upload permissions) only on the keys of
  `node_rights.node_writes(run, node, chief=node == chief_of(run's nodes))`, each rule one
  `resource.name.startsWith("projects/_/buckets/B/objects/<root><prefix>")`, with
  `&& resource.name.endsWith("<suffix>")` when the rule has a suffix (a registration in any
  attempt), the rules joined with `||`.

IAM's limits: a condition holds at most 12 logical operators (`&&`, `||`, `!`: "Overview of IAM
Conditions", https://cloud.google.com/iam/docs/conditions-overview, "Limitations"), so a node's
write rules are packed into as few objectAdmin bindings as keep each condition within 12 (a
worker: one; the chief, 13 rules: two). A condition's expression is at most 12,800 characters
(ibid.), its title 100 and its description 256 ("Expr",
https://cloud.google.com/iam/docs/reference/rest/v1/Expr). A policy's bindings may name at most
1,500 principals ("Policy", https://cloud.google.com/iam/docs/reference/rest/v1/Policy), and
IAM's policy limits ("Understanding allow policies", https://cloud.google.com/iam/docs/
policies, "Policy limits") allow at most 100 conditional role bindings per allow policy and at
most 20 bindings of the same role and principal (a node has 1 or 2): a run of N nodes puts
1 + N (+1 for the chief) conditional bindings on its bucket's policy, so the runs that share a
bucket at one time share those 100 (a 40-node run takes 42).

`startsWith`/`endsWith` on `resource.name` (an object is `projects/_/buckets/B/objects/NAME`)
and the `objectListPrefix` API attribute: "Attribute reference for IAM Conditions",
https://cloud.google.com/iam/docs/conditions-attribute-reference ("Resource name attribute",
"API attributes"). Roles and permissions: "IAM roles for Cloud Storage",
https://cloud.google.com/storage/docs/access-control/iam-roles; replacing an object needs
storage.objects.create and storage.objects.delete: "IAM permissions for JSON methods",
https://cloud.google.com/storage/docs/access-control/iam-json.
"""

from __future__ import annotations

import json
from typing import Any

from cloudtrain.jobs import node_rights, protocol
from cloudtrain.jobs.node_rights import KeyRule

OBJECT_ADMIN = "roles/storage.objectAdmin"
OBJECT_VIEWER = "roles/storage.objectViewer"
MAX_LOGICAL_OPERATORS = 12  # &&, || and ! in one IAM condition (IAM Conditions' limits)
MAX_EXPRESSION = 12800  # characters of one condition expression (ibid.)
LIST_PREFIX_ATTRIBUTE = "storage.googleapis.com/objectListPrefix"
# the run's key (cloudtrain/state/run_key.py `key_object`, a controller module this layer may not
# import), relative to the run's prefix: no node may read it
RUN_KEY_NAME = protocol.KEY_NAME


def objects_of(bucket: str, root: str) -> str:
    """The resource-name prefix of the objects under the store's root `root` ("" or ending in
    '/') in `bucket`. Pure."""
    return f"projects/_/buckets/{bucket}/objects/{root}"


def _starts(value: str) -> str:
    return f"resource.name.startsWith({json.dumps(value)})"


def rule_expression(bucket: str, root: str, rule: KeyRule) -> str:
    """One key rule as CEL: startsWith its prefix, `&& endsWith` its suffix if any. Pure."""
    term = _starts(objects_of(bucket, root) + rule.prefix)
    if rule.suffix:
        term += f" && resource.name.endsWith({json.dumps(rule.suffix)})"
    return term


def operators(rule: KeyRule) -> int:
    """The logical operators a rule's term holds (1 for a suffix, else 0). Pure."""
    return 1 if rule.suffix else 0


def pack(rules: tuple[KeyRule, ...]) -> list[list[KeyRule]]:
    """The rules in order, in as few groups as keep each group's `||`-joined condition within
    MAX_LOGICAL_OPERATORS. Pure."""
    groups: list[list[KeyRule]] = []
    count = 0
    for rule in rules:
        cost = operators(rule)
        if groups and count + 1 + cost <= MAX_LOGICAL_OPERATORS:
            groups[-1].append(rule)
            count += 1 + cost
        else:
            groups.append([rule])
            count = cost
    return groups


def _condition(title: str, about: str, expression: str) -> dict[str, str]:
    if len(expression) > MAX_EXPRESSION:
        raise ValueError(f"an IAM condition over {MAX_EXPRESSION} characters: {title}")
    return {"title": title[:100], "description": about[:256], "expression": expression}


def read_binding(email: str, bucket: str, root: str, run_id: str) -> dict[str, Any]:
    """The reads binding (see the module docstring), the same condition for every node of the
    run: `email` is one member of it. Pure."""
    prefix = f"{root}{protocol.run_prefix(run_id)}"
    run_objects = objects_of(bucket, root) + protocol.run_prefix(run_id)
    listing = f'api.getAttribute({json.dumps(LIST_PREFIX_ATTRIBUTE)}, "")'
    reads = (
        f"({_starts(run_objects)} && !{_starts(run_objects + RUN_KEY_NAME)})"
        f" || {listing}.startsWith({json.dumps(prefix)})"
    )
    about = f"cloudtrain run {run_id}: nodes read gs://{bucket}/{prefix}"
    return {
        "role": OBJECT_VIEWER,
        "members": {f"serviceAccount:{email}"},
        "condition": _condition(f"cloudtrain-{run_id}"[:88] + "-nodes-read", about, reads),
    }


def write_bindings(
    email: str, bucket: str, root: str, run_id: str, node: str, *, chief: bool
) -> list[dict[str, Any]]:
    """The node's objectAdmin bindings: `node_rights.node_writes` rendered and packed (see the
    module docstring). Pure."""
    groups = pack(node_rights.node_writes(run_id, node, chief=chief))
    out = []
    for n, group in enumerate(groups):
        expression = " || ".join(rule_expression(bucket, root, r) for r in group)
        suffix = f"-{node}-write-{n}"
        about = f"cloudtrain run {run_id}: node {node} writes its own keys in gs://{bucket}"
        out.append(
            {
                "role": OBJECT_ADMIN,
                "members": {f"serviceAccount:{email}"},
                "condition": _condition(
                    f"cloudtrain-{run_id}"[: 100 - len(suffix)] + suffix, about, expression
                ),
            }
        )
    return out


def node_bindings(
    email: str, bucket: str, root: str, run_id: str, node: str, *, chief: bool
) -> list[dict[str, Any]]:
    """Every binding of node `node`'s account `email` on the run's bucket: the reads binding
    and its write bindings. Pure."""
    return [
        read_binding(email, bucket, root, run_id),
        *write_bindings(email, bucket, root, run_id, node, chief=chief),
    ]


def chief_of(nodes: tuple[str, ...]) -> str | None:
    """The run's chief among `nodes` (node_rights.chief_of), None for no nodes. Pure."""
    return node_rights.chief_of(nodes) if nodes else None
