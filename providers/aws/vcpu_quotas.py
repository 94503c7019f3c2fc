"""EC2's vCPU quotas: which Service Quotas code an instance type counts against, on demand and
on spot (docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html). Pure; read by
the account probe (account.py) and by the error translation (errors.py) to name the quota.
"""

from __future__ import annotations

import re

# (quota class, spot) -> (Service Quotas code, quota name), classes by the names' family letters
_STANDARD = "Standard (A, C, D, H, I, M, R, T, Z)"
VCPU_QUOTAS = {
    ("standard", False): ("L-1216C47A", f"Running On-Demand {_STANDARD} instances"),
    ("g", False): ("L-DB2E81BA", "Running On-Demand G and VT instances"),
    ("p", False): ("L-417A185B", "Running On-Demand P instances"),
    ("standard", True): ("L-34B43A08", f"All {_STANDARD} Spot Instance Requests"),
    ("g", True): ("L-3819A6DF", "All G and VT Spot Instance Requests"),
    ("p", True): ("L-7212CCBC", "All P Spot Instance Requests"),
}
STANDARD_LETTERS = frozenset("acdhimrtz")
# families whose leading letter is a standard one but whose quota is their own (DL, HPC)
OWN_QUOTA_FAMILIES = frozenset({"dl", "hpc", "inf", "trn", "mac"})


def quota_class(instance_type: str) -> str | None:
    """ "standard", "g" or "p": the vCPU quota class of an instance type's family (G and VT
    share one); None for a family with a quota of its own (Inf, Trn, DL, F, X, U...). Pure."""
    match = re.match(r"([a-z]+)\d", instance_type.lower())
    family = match.group(1) if match else ""
    if family in ("g", "vt"):
        return "g"
    if family == "p":
        return "p"
    if family and family[0] in STANDARD_LETTERS and family not in OWN_QUOTA_FAMILIES:
        return "standard"
    return None


def vcpu_quota(instance_type: str, spot: bool) -> tuple[str, str] | None:
    """(code, name) of the EC2 vCPU quota `instance_type` counts against, on spot or on
    demand; None for a family with a quota of its own. Pure."""
    klass = quota_class(instance_type)
    return None if klass is None else VCPU_QUOTAS[(klass, spot)]
