"""Google Cloud IAM permissions that exist, as data: every permission of the resource
collections a run's caller needs (providers/gcp/controller_identity.py RUN_PERMISSIONS), so that
a misspelt permission -- or one in a collection of these that has no such verb -- is seen.
Test-side; pure; no network.

Source: the predefined roles' permissions as `gcloud iam roles describe` gives them, in
github.com/iann0036/iam-dataset (the dataset authz_reference_gcp.py's ROLES cites):
- gcp/roles/owner.json at commit 2073fa52 (2026-08-22): roles/owner's includedPermissions, for
  the compute.*, iam.* and resourcemanager.* collections below;
- gcp/roles/storage.admin.json at commit 9ac68908 (2026-05-16): roles/storage.admin's, for the
  storage.* collections (roles/owner holds no storage.objects.* permission: object data access
  is granted by the storage roles; https://cloud.google.com/storage/docs/access-control/iam-roles).
Each collection lists every verb that role file holds for it (copied whole, not only the ones
cloudtrain uses), so the table also shows that a near miss (`compute.instances.setServiceAccounts`)
is absent. The reference: https://cloud.google.com/iam/docs/permissions-reference.
"""

from __future__ import annotations

SOURCE = "iann0036/iam-dataset gcp/roles/owner.json@2073fa52, gcp/roles/storage.admin.json@9ac68908"


def _verbs(text: str) -> frozenset[str]:
    return frozenset(text.split())


# collection ("service.resources") -> the verbs its permissions end in
COLLECTIONS: dict[str, frozenset[str]] = {
    "compute.disks": _verbs(
        "addResourcePolicies create createSnapshot createTagBinding delete deleteTagBinding "
        "get getIamPolicy list listEffectiveTags listTagBindings removeResourcePolicies "
        "resize setIamPolicy setLabels startAsyncReplication stopAsyncReplication "
        "stopGroupAsyncReplication update updateKmsKey use useReadOnly"
    ),
    "compute.firewalls": _verbs(
        "create createTagBinding delete deleteTagBinding get list listEffectiveTags "
        "listTagBindings update"
    ),
    "compute.globalOperations": _verbs("delete get getIamPolicy list setIamPolicy"),
    "compute.instances": _verbs(
        "addAccessConfig addNetworkInterface addResourcePolicies attachDisk create "
        "createTagBinding delete deleteAccessConfig deleteNetworkInterface deleteTagBinding "
        "detachDisk get getEffectiveFirewalls getGuestAttributes getIamPolicy getScreenshot "
        "getSerialPortOutput getShieldedInstanceIdentity getShieldedVmIdentity "
        "getVmExtensionState list listEffectiveTags listReferrers listTagBindings "
        "listVmExtensionStates osAdminLogin osLogin pscInterfaceCreate removeResourcePolicies "
        "reset resume sendDiagnosticInterrupt setDeletionProtection setDiskAutoDelete "
        "setIamPolicy setLabels setMachineResources setMachineType setMetadata "
        "setMinCpuPlatform setName setScheduling setSecurityPolicy setServiceAccount "
        "setShieldedInstanceIntegrityPolicy setShieldedVmIntegrityPolicy setTags "
        "simulateMaintenanceEvent start startWithEncryptionKey stop suspend update "
        "updateAccessConfig updateDisplayDevice updateNetworkInterface updateSecurity "
        "updateShieldedInstanceConfig updateShieldedVmConfig use useReadOnly"
    ),
    "compute.networks": _verbs(
        "access addPeering create createTagBinding delete deleteTagBinding get "
        "getEffectiveFirewalls getRegionEffectiveFirewalls list listEffectiveTags "
        "listPeeringRoutes listTagBindings mirror removePeering setFirewallPolicy "
        "setNetworkPolicy switchToCustomMode update updatePeering updatePolicy use "
        "useExternalIp"
    ),
    "compute.regions": _verbs("get list"),
    "compute.subnetworks": _verbs(
        "create createTagBinding delete deleteTagBinding expandIpCidrRange get getIamPolicy "
        "list listEffectiveTags listTagBindings mirror setIamPolicy setPrivateIpGoogleAccess "
        "update use useExternalIp usePeerMigration"
    ),
    "compute.zoneOperations": _verbs("delete get getIamPolicy list setIamPolicy"),
    "iam.serviceAccounts": _verbs(
        "actAs create createTagBinding delete deleteTagBinding disable enable get "
        "getIamPolicy list listEffectiveTags listTagBindings setIamPolicy undelete update"
    ),
    "resourcemanager.projects": _verbs(
        "createBillingAssignment createPolicyBinding delete deleteBillingAssignment "
        "deletePolicyBinding get getIamPolicy list move searchPolicyBindings setIamPolicy "
        "undelete update updateLiens updatePolicyBinding"
    ),
    "storage.buckets": _verbs(
        "create createTagBinding delete deleteTagBinding enableObjectRetention get "
        "getIamPolicy getIpFilter getObjectInsights list listEffectiveTags listTagBindings "
        "relocate restore setIamPolicy setIpFilter update viewIntelligenceDetails"
    ),
    "storage.objects": _verbs(
        "create createContext delete deleteContext get getIamPolicy list move "
        "overrideUnlockedRetention restore setIamPolicy setRetention update updateContext"
    ),
}
PERMISSIONS = frozenset(f"{c}.{v}" for c, verbs in COLLECTIONS.items() for v in verbs)


def unknown(permissions: list[str] | tuple[str, ...]) -> list[str]:
    """The permissions not in PERMISSIONS (case-sensitive, as IAM names them), in order; a
    permission of a collection the table does not hold is unknown too. Pure."""
    return [p for p in permissions if p not in PERMISSIONS]
