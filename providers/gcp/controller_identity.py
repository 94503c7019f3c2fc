"""The controller node's identity on GCP (issue 17): a per-run service account that may touch only
this run.

The account (`controller_email`: `cc-<part of the run id>-<8 hex>`, display name
`cloudtrain controller <run_id>`, its description naming the run's bucket) gets:

- on the project (Resource Manager `projects.setIamPolicy`), `roles/compute.instanceAdmin.v1`
  under the conditions `instance_conditions`: instances and boot disks (a boot disk takes its
  instance's name) whose `resource.name` starts with `projects/P/zones/Z/instances/ct-<run>-`
  (resp. `.../disks/ct-<run>-`, each prefix under its own `resource.type ==`) in the run's
  region's zones, and resource types that hold no run's data (the subnetwork a NIC uses,
  operations); and `roles/compute.securityAdmin` on the run's own firewall rules only
  (`firewall_condition`, by exact name), so it can delete them.
  A condition holds at most 12 logical operators (`&&`, `||`, `!`) and one role and principal
  at most 20 conditional bindings ("Overview of IAM Conditions", Limitations,
  https://cloud.google.com/iam/docs/conditions-overview#limitations); each zone costs 2, the
  other types' clause 6, so the zones are packed like the nodes' write rules
  (node_bindings.pack): the first binding holds 2 zones and the other types, each further one
  up to 5 zones (`zone_groups`). A region of 1 or 2 zones takes 1 instanceAdmin binding, of 3
  to 7 zones 2: with securityAdmin, 2 or 3 of the project policy's conditional bindings per run
  (Google advises at most 100 in one allow policy: ibid., "Conditions in allow policies").
  The name formats are IAM's ("Resource attributes for IAM Conditions",
  https://cloud.google.com/iam/docs/conditions-resource-attributes: an instance is
  `projects/PROJECT/zones/ZONE/instances/NAME`), and the shape is the documented prefix grant
  ("Configure resource-based access", https://cloud.google.com/iam/docs/configuring-resource-
  based-access: instance and disk prefixes, plus `resource.type !=` for the types the VM's
  create also touches). A policy with a conditional binding must be written as version 3
  ("Policy versions", https://cloud.google.com/iam/docs/policies#versions), and read as 3 or
  its conditions come back stripped.
- on each node service account's own IAM policy (one per node id of the run: identity.py),
  `roles/iam.serviceAccountUser` (to create nodes, and their replacements, that run as it:
  "actAs"), and on no other account;
- on the run's bucket, the nodes' binding (`identity.prefix_binding`): objects under the run's
  prefix only.

Resources: controller-service-account (id: its email), controller-project-binding (id: the
email; the member in the project policy), controller-account-binding (id: a node account's
email; the member in that account's policy; one per node account). Deleting the account
revokes its bindings first.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from cloudtrain.core import env
from cloudtrain.core.errors import NotFound, ProviderError, TransientError
from cloudtrain.providers.base import Resource, Tagged
from cloudtrain.providers.gcp import identity
from cloudtrain.providers.gcp.errors import already_exists, error_codes
from cloudtrain.providers.gcp.identity import IamClient, NotVisibleYet, PolicyConflict
from cloudtrain.providers.gcp.node_bindings import MAX_LOGICAL_OPERATORS

KIND_ACCOUNT = "controller-service-account"
KIND_PROJECT_BINDING = "controller-project-binding"
KIND_ACCOUNT_BINDING = "controller-account-binding"
DISPLAY_PREFIX = "cloudtrain controller "
INSTANCE_ADMIN = "roles/compute.instanceAdmin.v1"
SECURITY_ADMIN = "roles/compute.securityAdmin"
ACCOUNT_USER = "roles/iam.serviceAccountUser"
CRM_ENDPOINT_ENV = env.CRM_ENDPOINT.name
CRM_API = "https://cloudresourcemanager.googleapis.com"
# the compute types instanceAdmin.v1 reaches that may hold data or launch VMs: never granted
# beyond the run's instances and disks
GUARDED_TYPES = (
    "compute.googleapis.com/Instance",
    "compute.googleapis.com/Disk",
    "compute.googleapis.com/Image",
    "compute.googleapis.com/Snapshot",
    "compute.googleapis.com/MachineImage",
    "compute.googleapis.com/InstanceTemplate",
)
_CONFLICT = frozenset({"409", "412"})
# IAM's limits ("Overview of IAM Conditions", Limitations, https://cloud.google.com/iam/docs/
# conditions-overview#limitations): at most 12 logical operators in one condition and 20
# conditional bindings of one role and principal; a title of at most 100 characters and a
# description of 256 ("Expr", https://cloud.google.com/iam/docs/reference/rest/v1/Expr)
MAX_BINDINGS_PER_ROLE = 20
TITLE_MAX, DESCRIPTION_MAX = 100, 256

# The permissions a run's launcher (the laptop's `cloudtrain run` and `down`) uses in the
# project: the one list of the rights a run needs (account.py's `missing_rights()` asks
# Resource Manager's testIamPermissions about exactly these). By the calls that need them
# (each method's "IAM Permissions" in the REST reference; an insert's by what its body sets,
# bodies.py: "Required permissions" of cloud.google.com/compute/docs/instances/
# create-start-instance): the VMs (compute.py), their operations (clients.py), the region
# (compute.py), the firewall rules (network.py; a rule's create and delete also need
# networks.updatePolicy), the node and controller accounts and their policies (identity.py,
# this module; actAs to run a VM as one), the project policy (this module), the bucket and
# its objects (storage.py, gcs_transfers.py). The controller node itself gets only the roles
# above, scoped to the run.
RUN_PERMISSIONS: tuple[str, ...] = (
    "compute.disks.create",
    "compute.firewalls.create",
    "compute.firewalls.delete",
    "compute.firewalls.get",
    "compute.firewalls.list",
    "compute.globalOperations.get",
    "compute.instances.create",
    "compute.instances.delete",
    "compute.instances.get",
    "compute.instances.getSerialPortOutput",
    "compute.instances.list",
    "compute.instances.setLabels",
    "compute.instances.setMetadata",
    "compute.instances.setServiceAccount",
    "compute.instances.setTags",
    "compute.networks.updatePolicy",
    "compute.regions.get",
    "compute.subnetworks.use",
    "compute.subnetworks.useExternalIp",
    "compute.zoneOperations.get",
    "iam.serviceAccounts.actAs",
    "iam.serviceAccounts.create",
    "iam.serviceAccounts.delete",
    "iam.serviceAccounts.get",
    "iam.serviceAccounts.getIamPolicy",
    "iam.serviceAccounts.list",
    "iam.serviceAccounts.setIamPolicy",
    "resourcemanager.projects.getIamPolicy",
    "resourcemanager.projects.setIamPolicy",
    "storage.buckets.create",
    "storage.buckets.get",
    "storage.buckets.getIamPolicy",
    "storage.buckets.setIamPolicy",
    "storage.buckets.update",
    "storage.objects.create",
    "storage.objects.delete",
    "storage.objects.get",
    "storage.objects.list",
)
# What a TPU run's launcher uses besides (tpu_nodes.py: nodes and their operations for an
# on-demand TPU VM, queued resources for a spot one, both listed by `down` and `gc`), by the
# permission Cloud TPU's IAM reference names for each call
# (docs.cloud.google.com/iam/docs/roles-permissions/tpu), the names the box's TPU fake
# enforces (tests/fakes/tpu_access.py). Asked only of a TPU run (account.py): a GPU run's
# caller needs none of them. The controller node of a managed run gets none (no per-run TPU
# grant exists: Cloud TPU has no resource-level IAM), so a TPU run is not handed to one.
TPU_PERMISSIONS: tuple[str, ...] = (
    "tpu.nodes.create",
    "tpu.nodes.delete",
    "tpu.nodes.get",
    "tpu.nodes.list",
    "tpu.operations.get",
    "tpu.queuedResources.create",
    "tpu.queuedResources.delete",
    "tpu.queuedResources.get",
    "tpu.queuedResources.list",
)


def controller_account_id(run_id: str) -> str:
    """`cc-<up to 18 chars of the run id>-<8 hex>`: 6-30 chars, never a node account's `ct-`
    id, the same for the same run. Pure."""
    readable = re.sub(r"[^a-z0-9-]+", "-", run_id.lower())[:18].strip("-")
    digest = hashlib.sha256(f"{run_id}/controller".encode()).hexdigest()[:8]
    return f"cc-{readable}-{digest}" if readable else f"cc-{digest}"


def controller_email(project: str, run_id: str) -> str:
    """The controller account's email in `project` (domain-scoped projects too). Pure."""
    return f"{controller_account_id(run_id)}@{identity.email_domain(project)}"


def controller_run_of(account: dict[str, Any]) -> str | None:
    """The run of a listed controller account, or None when it is not one. Pure."""
    shown = str(account.get("displayName") or "")
    if not shown.startswith(DISPLAY_PREFIX):
        return None
    run_id = shown[len(DISPLAY_PREFIX) :]
    local = str(account.get("email") or "").split("@", 1)[0]
    return run_id if run_id and local == controller_account_id(run_id) else None


def instance_prefix(run_id: str) -> str:
    """What every node name of the run starts with (base.node_name: `ct-<run>-<role>-<i>`).
    Run ids end in six hex digits, so another run's names share it only if that run's job
    name were this whole run id. Pure."""
    return f"ct-{run_id}-"


def _quoted(value: str) -> str:
    return json.dumps(value)  # a CEL string literal


def _ops(zones: int, others: bool) -> int:
    """The logical operators of `_instances_expression` over `zones` (>= 1) zones, with the
    other types' clause or not: per kind a type test `&&` its zones' startsWith joined by `||`
    (1 + zones - 1), the two kinds joined by `||`; the other types' `!=` tests joined by `&&`,
    and the `||` before them. Pure."""
    return 2 * zones + 1 + (len(GUARDED_TYPES) if others else 0)


def zone_groups(zones: list[str]) -> list[list[str]]:
    """The region's zones (sorted, once each) in as few groups as keep each instanceAdmin.v1
    condition within MAX_LOGICAL_OPERATORS: the first group shares its condition with the
    other types' clause (2 zones), each further one has a binding of its own (5 zones). No
    zones: one empty group (the other types only). Pure."""
    groups: list[list[str]] = [[]]
    for zone in sorted(set(zones)):
        if _ops(len(groups[-1]) + 1, len(groups) == 1) > MAX_LOGICAL_OPERATORS:
            groups.append([])
        groups[-1].append(zone)
    return groups


def _instances_expression(project: str, zones: list[str], run_id: str, others: bool) -> str:
    """`(Instance && its names in zones) || (Disk && its names in zones)`, `|| (the other
    types)` when `others` (see the module docstring). Pure."""
    clauses = []
    for rtype, kind in ((GUARDED_TYPES[0], "instances"), (GUARDED_TYPES[1], "disks")):
        if not zones:
            continue
        names = " || ".join(
            f"resource.name.startsWith("
            f"{_quoted(f'projects/{project}/zones/{z}/{kind}/{instance_prefix(run_id)}')})"
            for z in zones
        )
        clauses.append(f"(resource.type == {_quoted(rtype)} && ({names}))")
    if others:
        clauses.append(
            "(" + " && ".join(f"resource.type != {_quoted(t)}" for t in GUARDED_TYPES) + ")"
        )
    return " || ".join(clauses)


def instance_conditions(project: str, zones: list[str], run_id: str) -> list[dict[str, str]]:
    """The conditions of the instanceAdmin.v1 bindings, one per `zone_groups` group (see the
    module docstring): together, the run's instances and disks in `zones` and the types that
    hold no run's data. Raises ProviderError past IAM's 20 bindings of one role and
    principal (a region of about 97 zones). Pure."""
    groups = zone_groups(zones)
    if len(groups) > MAX_BINDINGS_PER_ROLE:
        raise ProviderError(
            f"{len(set(zones))} zones need {len(groups)} conditional bindings of "
            f"{INSTANCE_ADMIN}, over IAM's {MAX_BINDINGS_PER_ROLE} per role and principal"
        )
    out = []
    for n, group in enumerate(groups):
        suffix = "-controller-instances" + (f"-{n + 1}" if n else "")
        about = f"cloudtrain run {run_id}: its controller node may manage its VMs only"
        if n:
            about += f" (in {', '.join(group)})"
        out.append(
            {
                "title": f"cloudtrain-{run_id}"[: TITLE_MAX - len(suffix)] + suffix,
                "description": about[:DESCRIPTION_MAX],
                "expression": _instances_expression(project, group, run_id, others=n == 0),
            }
        )
    return out


def firewall_condition(project: str, run_id: str, rule_names: list[str]) -> dict[str, str]:
    """The condition of the securityAdmin binding: the run's firewall rules, by name. Pure."""
    names = " || ".join(
        f"resource.name == {_quoted(f'projects/{project}/global/firewalls/{n}')}"
        for n in rule_names
    )
    return {
        "title": f"cloudtrain-{run_id}-controller-firewalls"[:100],
        "description": f"cloudtrain run {run_id}: its controller may delete its firewall rules",
        "expression": f'resource.type == "compute.googleapis.com/Firewall" && ({names})',
    }


def project_bindings(
    project: str, zones: list[str], run_id: str, email: str, rule_names: list[str]
) -> list[dict[str, Any]]:
    """The controller's conditional project bindings: instanceAdmin.v1 (one per zone group,
    `instance_conditions`), then securityAdmin. Pure."""
    member = [f"serviceAccount:{email}"]
    return [
        *(
            {"role": INSTANCE_ADMIN, "members": member, "condition": condition}
            for condition in instance_conditions(project, zones, run_id)
        ),
        {
            "role": SECURITY_ADMIN,
            "members": member,
            "condition": firewall_condition(project, run_id, rule_names),
        },
    ]


# --- allow policies: read-modify-write, version 3 -------------------------------------------------


def _crm_base(project: str) -> str:
    endpoint = (
        env.CRM_ENDPOINT.text()
        or env.IAM_ENDPOINT.text()  # the fake serves both
        or CRM_API
    )
    return f"{endpoint.rstrip('/')}/v1/projects/{project}"


def _update(
    iam: IamClient,
    base: str,
    what: str,
    change: Callable[[list[dict[str, Any]]], bool],
    new_account: str | None = None,
) -> None:
    """getIamPolicy (version 3) -> `change` -> setIamPolicy with the etag and version 3, redone
    while the policy changed underneath (409) or IAM does not know `new_account` yet
    (`identity.while_propagating`). Raises NotFound when the policy's owner is gone. Blocks."""

    def once() -> None:
        policy = iam.call(
            "POST",
            f"{base}:getIamPolicy",
            f"read the IAM policy of {base}",
            {"options": {"requestedPolicyVersion": 3}},
        )
        bindings = [dict(b) for b in policy.get("bindings") or []]
        if not change(bindings):
            return
        body = {"policy": {"version": 3, "etag": policy.get("etag", ""), "bindings": bindings}}
        try:
            iam.call("POST", f"{base}:setIamPolicy", what, body)
        except ProviderError as err:
            if error_codes(err) & _CONFLICT:
                raise PolicyConflict(f"{what}: the policy kept changing underneath") from err
            if new_account is not None and identity.not_visible_yet(err, new_account):
                raise NotVisibleYet(f"{what}: {new_account} is not known yet") from err
            raise

    identity.while_propagating(once, what, (PolicyConflict, NotVisibleYet))


def _add(wanted: list[dict[str, Any]]) -> Callable[[list[dict[str, Any]]], bool]:
    """A `change` adding each wanted binding's members (same role and condition). Pure."""

    def change(bindings: list[dict[str, Any]]) -> bool:
        changed = False
        for want in wanted:
            same = next(
                (
                    b
                    for b in bindings
                    if b.get("role") == want["role"] and b.get("condition") == want.get("condition")
                ),
                None,
            )
            if same is None:
                bindings.append(dict(want))
                changed = True
            elif not set(want["members"]) <= set(same.get("members") or []):
                same["members"] = sorted(set(same.get("members") or []) | set(want["members"]))
                changed = True
        return changed

    return change


def _is(member: str, email: str) -> bool:
    """`member` is the account, or the account after its deletion (`deleted:...?uid=`)."""
    return member == f"serviceAccount:{email}" or member.startswith(
        f"deleted:serviceAccount:{email}?uid="
    )


def _remove(email: str) -> Callable[[list[dict[str, Any]]], bool]:
    """A `change` removing the account from every binding (empty bindings go). Pure."""

    def change(bindings: list[dict[str, Any]]) -> bool:
        if not any(_is(m, email) for b in bindings for m in b.get("members") or []):
            return False
        for b in bindings:
            b["members"] = [m for m in b.get("members") or [] if not _is(m, email)]
        bindings[:] = [b for b in bindings if b["members"]]
        return True

    return change


def _members(iam: IamClient, base: str) -> list[str]:
    """Every member of the policy at `base`; [] when its owner is gone, or when the caller may
    not read it (403: a `down` by a user without getIamPolicy there must still tear the run
    down; a grant it cannot see is left, and grants nothing once the account is gone).
    Blocks."""
    try:
        policy = iam.call(
            "POST",
            f"{base}:getIamPolicy",
            f"read the IAM policy of {base}",
            {"options": {"requestedPolicyVersion": 3}},
        )
    except NotFound:
        return []
    except ProviderError as err:
        if error_codes(err) & {"403", "PERMISSION_DENIED", "forbidden"}:
            return []
        raise
    return [m for b in policy.get("bindings") or [] for m in b.get("members") or []]


def _account_base(iam: IamClient, email: str) -> str:
    return f"projects/{iam.project}/serviceAccounts/{email}"


# --- the identity's lifecycle -------------------------------------------------------------------


def planned(project: str, run_id: str, node_accounts: list[str]) -> list[Resource]:
    """The controller's account, its project grant and its grant on each node account, for
    the ledger. Pure."""
    email = controller_email(project, run_id)
    return [
        Resource("gcp", KIND_ACCOUNT, email, "global", run_id),
        Resource("gcp", KIND_PROJECT_BINDING, email, "global", run_id),
        *(Resource("gcp", KIND_ACCOUNT_BINDING, a, "global", run_id) for a in node_accounts),
    ]


def ensure(
    iam: IamClient,
    storage: Any,
    run_id: str,
    zones: list[str],
    node_accounts: list[str],
    rule_names: list[str],
    bucket: str | None,
    root: str,
) -> list[Resource]:
    """Create the controller's account (409: an existing one of this run is fine) and grant it
    the project bindings, `serviceAccountUser` on each of `node_accounts`, and the run's prefix of
    `bucket` (see the module docstring). Idempotent; blocks until the grants are written."""
    project = iam.project
    email = controller_email(project, run_id)
    about = f"cloudtrain run {run_id}: controller node"
    if bucket:
        about += f", objects of gs://{bucket} under cloudtrain/runs/{run_id}/ only"
    body = {
        "accountId": controller_account_id(run_id),
        "serviceAccount": {
            "displayName": (DISPLAY_PREFIX + run_id)[: identity.DISPLAY_MAX],
            "description": about[: identity.DESCRIPTION_MAX],
        },
    }
    what = f"create service account {email}"
    try:
        account = iam.call("POST", f"projects/{project}/serviceAccounts", what, body)
    except ProviderError as err:
        if not already_exists(err):
            raise
        found = iam.get(email)
        if found is None:
            raise TransientError(f"{what}: it exists but cannot be read yet") from err
        if controller_run_of(found) != run_id:
            raise ProviderError(
                f"{what}: an account of that id exists and is not run {run_id}'s controller",
                hint="delete it",
            ) from err
        account = found
    _update(
        iam,
        _crm_base(project),
        f"grant {email} this run's VMs and firewall rules in project {project}",
        _add(project_bindings(project, zones, run_id, email, rule_names)),
        new_account=email,
    )
    for node_account in node_accounts:
        _update(
            iam,
            _account_base(iam, node_account),
            f"let {email} act as {node_account}",
            _add([{"role": ACCOUNT_USER, "members": [f"serviceAccount:{email}"]}]),
            new_account=email,
        )
    if bucket:
        identity.grant(storage, email, bucket, root, run_id)
    unique = account.get("uniqueId")
    return [
        Resource("gcp", KIND_ACCOUNT, email, "global", run_id, unique and str(unique)),
        Resource("gcp", KIND_PROJECT_BINDING, email, "global", run_id),
        *(Resource("gcp", KIND_ACCOUNT_BINDING, a, "global", run_id) for a in node_accounts),
    ]


def find(iam: IamClient, run_id: str, node_accounts: list[str]) -> list[Resource]:
    """What of the controller's identity exists: its account (by its derived id, checked
    against its display name), its member in the project policy (deleted form too), its member
    in each of `node_accounts`' policies. Blocks; read-only."""
    project = iam.project
    email = controller_email(project, run_id)
    out: list[Resource] = []
    account = iam.get(email)
    if account is not None and controller_run_of(account) == run_id:
        unique = account.get("uniqueId")
        out.append(Resource("gcp", KIND_ACCOUNT, email, "global", run_id, unique and str(unique)))
    if any(_is(m, email) for m in _members(iam, _crm_base(project))):
        out.append(Resource("gcp", KIND_PROJECT_BINDING, email, "global", run_id))
    for node_account in node_accounts:
        if any(_is(m, email) for m in _members(iam, _account_base(iam, node_account))):
            out.append(Resource("gcp", KIND_ACCOUNT_BINDING, node_account, "global", run_id))
    return out


def delete(iam: IamClient, storage: Any, resources: list[Resource]) -> None:
    """Remove the controller's grants among `resources`, then its account (its bucket binding
    first). Other kinds are ignored. Idempotent: gone ones are fine. Blocks."""
    project = iam.project
    for res in resources:
        if res.kind == KIND_ACCOUNT_BINDING:
            email = controller_email(project, res.run_id)
            with contextlib.suppress(NotFound):  # the nodes' account is gone: so is its policy
                _update(
                    iam, _account_base(iam, res.id), f"remove {email} from {res.id}", _remove(email)
                )
    for res in resources:
        if res.kind in (KIND_PROJECT_BINDING, KIND_ACCOUNT):
            email = controller_email(project, res.run_id)
            _update(
                iam, _crm_base(project), f"remove {email} from project {project}", _remove(email)
            )
    for res in resources:
        if res.kind == KIND_ACCOUNT:
            account = iam.get(res.id)
            if account is None:
                continue
            bucket = identity.bucket_of(account)
            if bucket is not None:
                identity.revoke(storage, res.id, bucket)
            iam.delete(res.id)


def tagged(accounts: list[dict[str, Any]]) -> list[Tagged]:
    """Every run's controller account among `accounts` (an IAM listing), as Tagged. Pure."""
    out = []
    for account in accounts:
        run_id = controller_run_of(account)
        if run_id is not None:
            out.append(Tagged(run_id, KIND_ACCOUNT, str(account["email"]), None))
    return out
