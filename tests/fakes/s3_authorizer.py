"""An S3 authorizer in front of moto's server: a role's temporary credentials get only what the
role's policies allow, as on S3 (issue 29: the box's store refuses a node by itself).

moto's own IAM access control cannot serve: moto/iam/access_control.py leaves the Resource and
Condition elements of identity policies as TODO (a statement applies to every resource) and it
turns an unmet condition into a Deny. So `S3Authorizer` wraps moto's WSGI application
(`tests/fakes/moto_server.start_moto` installs it) and, for each S3 request signed with
credentials that moto's STS issued by AssumeRole (what a node takes from its instance metadata
service, tests/fakes/imds_credentials_aws.py):

1. authenticates it: the session token must be the one issued with the key (else 400
   InvalidToken), the credentials unexpired (else 400 ExpiredToken), and the SigV4 signature of
   the Authorization header must be the one botocore's S3SigV4Auth computes with the key's
   secret (else 403 SignatureDoesNotMatch). A presigned (query-string) request is authorized
   the same way, its signature not recomputed (nodes do not presign);
2. authorizes it: the request becomes an action, a resource ARN and its condition keys (`judge`,
   per "Actions, resources, and condition keys for Amazon S3", docs.aws.amazon.com/
   service-authorization/latest/reference/list_amazons3.html, and "Required permissions for
   Amazon S3 API operations", docs.aws.amazon.com/AmazonS3/latest/userguide/
   using-with-s3-policy-actions.html), evaluated against the role's inline and attached policies
   with tests/fakes/iam_policy_eval.py (the evaluator of the unit tests); a refusal is S3's
   `403 AccessDenied` XML error (docs.aws.amazon.com/AmazonS3/latest/API/ErrorResponses.html).

Requests with any other key (the box's dummy account-owner key: the laptop's CLI, the test, a
managed run's controller VM) and non-S3 requests pass unchanged. DeleteObjects (POST ?delete)
needs s3:DeleteObject on every key; S3 answers a partial refusal per key inside a 200, here the
whole request is refused (no node sends one). Only path-style addressing is parsed (the box's
endpoints are IP addresses, where botocore always uses it).
"""

from __future__ import annotations

import hmac
import io
import urllib.parse
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from typing import Any

from tests.fakes.iam_policy_eval import decide

Judgement = list[tuple[str, str, dict[str, str]]]  # (action, resource ARN, condition keys)
StartResponse = Callable[..., Any]
_ERRORS = {
    "AccessDenied": (403, "Access Denied"),
    "SignatureDoesNotMatch": (
        403,
        "The request signature we calculated does not match the signature you provided.",
    ),
    "InvalidToken": (400, "The provided token is malformed or otherwise invalid."),
    "ExpiredToken": (400, "The provided token has expired."),
}
# object subresources (query parameters) -> the action of each method on them
_OBJECT_SUBRESOURCES = {
    "acl": {"GET": "s3:GetObjectAcl", "HEAD": "s3:GetObjectAcl", "PUT": "s3:PutObjectAcl"},
    "tagging": {
        "GET": "s3:GetObjectTagging",
        "PUT": "s3:PutObjectTagging",
        "DELETE": "s3:DeleteObjectTagging",
    },
    "retention": {"GET": "s3:GetObjectRetention", "PUT": "s3:PutObjectRetention"},
    "legal-hold": {"GET": "s3:GetObjectLegalHold", "PUT": "s3:PutObjectLegalHold"},
    "attributes": {"GET": "s3:GetObjectAttributes"},
    "restore": {"POST": "s3:RestoreObject"},
}
_BUCKET_SUBRESOURCES = {
    "uploads": "s3:ListBucketMultipartUploads",
    "versions": "s3:ListBucketVersions",
    "location": "s3:GetBucketLocation",
}
# A bucket's configuration calls, each judged by its own action, not s3:CreateBucket (the S3 API
# Reference's "Permissions" of each: PutBucketLifecycleConfiguration and DeleteBucketLifecycle
# need s3:PutLifecycleConfiguration, GetBucketLifecycleConfiguration s3:GetLifecycleConfiguration,
# PutBucketEncryption s3:PutEncryptionConfiguration, PutPublicAccessBlock
# s3:PutBucketPublicAccessBlock, PutBucketTagging s3:PutBucketTagging, PutBucketPolicy
# s3:PutBucketPolicy, PutBucketVersioning s3:PutBucketVersioning, and their GETs the Get twins)
_BUCKET_CONFIGURATION = {
    ("PUT", "lifecycle"): "s3:PutLifecycleConfiguration",
    ("DELETE", "lifecycle"): "s3:PutLifecycleConfiguration",
    ("GET", "lifecycle"): "s3:GetLifecycleConfiguration",
    ("PUT", "encryption"): "s3:PutEncryptionConfiguration",
    ("GET", "encryption"): "s3:GetEncryptionConfiguration",
    ("PUT", "publicAccessBlock"): "s3:PutBucketPublicAccessBlock",
    ("GET", "publicAccessBlock"): "s3:GetBucketPublicAccessBlock",
    ("PUT", "tagging"): "s3:PutBucketTagging",
    ("GET", "tagging"): "s3:GetBucketTagging",
    ("PUT", "policy"): "s3:PutBucketPolicy",
    ("GET", "policy"): "s3:GetBucketPolicy",
    ("PUT", "versioning"): "s3:PutBucketVersioning",
    ("GET", "versioning"): "s3:GetBucketVersioning",
}


class S3Authorizer:
    """WSGI middleware: authorizes the S3 requests of assumed-role credentials (the module
    docstring) and passes everything else to `app`. Thread-safe (reads moto's backends)."""

    def __init__(self, app: Callable[[dict[str, Any], StartResponse], Iterable[bytes]]) -> None:
        self.app = app
        # (action, resource, role name) of each refusal; the role name ends in " (revoked)"
        # when the role held no policy any more or was gone (a node writing after teardown
        # deleted its role's policy, then its role)
        self.refused: list[tuple[str, str, str]] = []

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        answer = self._check(environ)
        if answer is None:
            return self.app(environ, start_response)
        code, resource = answer
        status, message = _ERRORS[code]
        body = _error_xml(code, message, resource)
        head = environ.get("REQUEST_METHOD") == "HEAD"
        start_response(
            f"{status} {'Forbidden' if status == 403 else 'Bad Request'}",
            [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))],
        )
        return [b"" if head else body]

    def _check(self, environ: dict[str, Any]) -> tuple[str, str] | None:
        """None to pass the request on, else (error code, resource) to refuse it with."""
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth.startswith("AWS4-HMAC-SHA256 "):
            scope = _between(auth, "Credential=", ",")
            token = environ.get("HTTP_X_AMZ_SECURITY_TOKEN", "")
        elif "X-Amz-Credential" in query:
            scope = query["X-Amz-Credential"][0]
            token = query.get("X-Amz-Security-Token", [""])[0]
        else:
            return None
        key_id, _, rest = scope.partition("/")
        parts = rest.split("/")
        if len(parts) < 3 or parts[2] != "s3":
            return None
        assumed = _assumed_role(key_id)
        if assumed is None:
            return None  # the box's own key (or a user's): not enforced here
        if token != assumed.session_token:
            return "InvalidToken", ""
        if assumed.expiration.replace(tzinfo=timezone.utc) <= datetime.now(timezone.utc):
            return "ExpiredToken", ""
        if auth and not _signature_ok(environ, auth, assumed, parts[1]):
            return "SignatureDoesNotMatch", ""
        policies = _role_policies(assumed.role_arn)
        role = assumed.role_arn.rsplit("/", 1)[1] + ("" if policies else " (revoked)")
        for action, resource, context in judge(environ, query):
            if not decide(policies or [], action, resource, context):
                self.refused.append((action, resource, role))
                return "AccessDenied", resource
        return None


def judge(environ: dict[str, Any], query: dict[str, list[str]]) -> Judgement:
    """What an S3 request needs: (action, resource ARN, condition keys) for each permission
    (a copy needs s3:GetObject on its source too). Path-style requests. Reads the body of a
    DeleteObjects request (and puts it back). Pure otherwise; unknown requests need an action
    no policy grants (`s3:Unknown...`), so they are refused."""
    method = environ.get("REQUEST_METHOD", "GET")
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
    path = urllib.parse.unquote(urllib.parse.urlsplit(raw).path)
    bucket, _, key = path.lstrip("/").partition("/")
    if not key:
        return _bucket_request(environ, method, bucket, query)
    arn = f"arn:aws:s3:::{bucket}/{key}"
    out: Judgement = []
    sub = next((s for s in _OBJECT_SUBRESOURCES if s in query), None)
    if sub is not None:
        action = _OBJECT_SUBRESOURCES[sub].get(method, f"s3:Unknown{method}{sub}")
    elif "uploadId" in query:  # multipart: parts and completion are PutObject (mpuoverview)
        action = {
            "GET": "s3:ListMultipartUploadParts",
            "DELETE": "s3:AbortMultipartUpload",
        }.get(method, "s3:PutObject")
    elif method in ("GET", "HEAD"):
        action = "s3:GetObjectVersion" if "versionId" in query else "s3:GetObject"
    elif method in ("PUT", "POST"):  # PutObject, CopyObject, CreateMultipartUpload
        action = "s3:PutObject"
    elif method == "DELETE":
        action = "s3:DeleteObjectVersion" if "versionId" in query else "s3:DeleteObject"
    else:
        action = f"s3:Unknown{method}"
    out.append((action, arn, {}))
    source = environ.get("HTTP_X_AMZ_COPY_SOURCE")
    if source and method == "PUT":  # CopyObject / UploadPartCopy: read the source too
        src = urllib.parse.unquote(source.split("?", 1)[0]).lstrip("/")
        out.append(("s3:GetObject", f"arn:aws:s3:::{src}", {}))
    return out


def _bucket_request(
    environ: dict[str, Any], method: str, bucket: str, query: dict[str, list[str]]
) -> Judgement:
    arn = f"arn:aws:s3:::{bucket}"
    if method == "POST" and "delete" in query:  # DeleteObjects: s3:DeleteObject on each key
        return [("s3:DeleteObject", f"{arn}/{k}", {}) for k in _deleted_keys(environ)]
    config = next((c for m, c in _BUCKET_CONFIGURATION if m == method and c in query), None)
    if config is not None:
        return [(_BUCKET_CONFIGURATION[(method, config)], arn, {})]
    if method in ("PUT", "DELETE") and set(query) - {"x-id"}:  # a configuration not modelled
        return [(f"s3:UnknownBucket{method}{sorted(query)}", arn, {})]
    if method == "GET":
        sub = next((s for s in _BUCKET_SUBRESOURCES if s in query), None)
        if sub is not None:
            return [(_BUCKET_SUBRESOURCES[sub], arn, {})]
        known = {"list-type", "prefix", "delimiter", "continuation-token", "start-after"}
        known |= {"max-keys", "encoding-type", "fetch-owner", "marker", "x-id"}
        if set(query) - known:
            return [(f"s3:UnknownBucketGET{sorted(query)}", arn, {})]
        context = {"s3:prefix": query["prefix"][0]} if "prefix" in query else {}
        for name in ("delimiter", "max-keys"):
            if name in query:
                context[f"s3:{name}"] = query[name][0]
        return [("s3:ListBucket", arn, context)]
    if method == "HEAD":  # HeadBucket needs s3:ListBucket (S3 API Reference, HeadBucket)
        return [("s3:ListBucket", arn, {})]
    action = {"PUT": "s3:CreateBucket", "DELETE": "s3:DeleteBucket"}.get(method)
    return [(action or f"s3:UnknownBucket{method}", arn, {})]


def _deleted_keys(environ: dict[str, Any]) -> list[str]:
    """The keys of a DeleteObjects body; the body is put back for moto."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    try:
        root = ET.fromstring(body)
    except ET.ParseError:
        return [""]
    return [el.text or "" for el in root.iter() if el.tag.rsplit("}", 1)[-1] == "Key"]


def _between(text: str, start: str, end: str) -> str:
    return text.split(start, 1)[1].split(end, 1)[0] if start in text else ""


def _assumed_role(key_id: str) -> Any:
    """moto STS's assumed role whose access key is `key_id`, or None."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.sts.models import sts_backends

    for role in list(sts_backends[DEFAULT_ACCOUNT_ID]["aws"].assumed_roles):
        if role.access_key_id == key_id:
            return role
    return None


def _role_policies(role_arn: str) -> list[dict[str, Any]] | None:
    """The identity policies (inline, then attached) of the role, from moto's IAM; None when
    the role is gone (its credentials then grant nothing)."""
    import json

    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    backend = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    try:
        role = backend.get_role_by_arn(role_arn)
    except Exception:  # the role is gone
        return None
    docs = [json.loads(d) for d in role.policies.values()]
    for managed in role.managed_policies.values():
        default = [v for v in managed.versions if v.is_default_version]
        docs += [json.loads(v.document) for v in default]
    return docs


def _signature_ok(environ: dict[str, Any], auth: str, assumed: Any, region: str) -> bool:
    """Whether the Authorization header's SigV4 signature is the one botocore's S3SigV4Auth
    computes for the request's signed headers with the assumed role's secret."""
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    signed = _between(auth, "SignedHeaders=", ",").split(";")
    headers = {name: _header(environ, name) for name in signed}
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or ""
    request = AWSRequest(
        method=environ.get("REQUEST_METHOD", "GET"),
        url=f"http://{environ.get('HTTP_HOST', '')}{raw}",
        headers=headers,
    )
    request.context["timestamp"] = headers.get("x-amz-date", "")
    creds = Credentials(assumed.access_key_id, assumed.secret_access_key, assumed.session_token)
    signer = S3SigV4Auth(creds, "s3", region)
    canonical = signer.canonical_request(request)
    wanted = signer.signature(signer.string_to_sign(request, canonical), request)
    given = auth.split("Signature=", 1)[-1].strip()
    return hmac.compare_digest(wanted, given)


def _header(environ: dict[str, Any], name: str) -> str:
    if name == "content-type":
        return str(environ.get("CONTENT_TYPE", ""))
    if name == "content-length":
        return str(environ.get("CONTENT_LENGTH", ""))
    return str(environ.get("HTTP_" + name.upper().replace("-", "_"), ""))


def _error_xml(code: str, message: str, resource: str) -> bytes:
    request_id = uuid.uuid4().hex[:16].upper()
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{_escape(resource)}</Resource><RequestId>{request_id}</RequestId>"
        f"<HostId>{uuid.uuid4().hex}</HostId></Error>"
    ).encode()


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
