"""A WSGI front before moto (and before tests/fakes/s3_authorizer.py) that makes the box's AWS
account as stingy as a real one (issue 30). Its state and test-side API: tests/fakes/
aws_account.py's `AwsAccount`. For each SigV4-signed request it:

1. finds the caller: an access key of an IAM user made in moto (its SigV4 signature checked
   with botocore's own signer, else 403 SignatureDoesNotMatch), or the box's own key (the
   account owner, whose rights `AwsAccount.deny` narrows). Keys of roles assumed through
   moto's STS (the nodes') pass on unchanged: tests/fakes/s3_authorizer.py judges their S3;
2. authorizes the call against the caller's identity policies with tests/fakes/
   iam_policy_eval.py: the IAM action is the service's prefix and the operation's name (EC2,
   IAM, STS: the query's `Action`; JSON services: `X-Amz-Target`; S3: s3_authorizer.judge).
   EC2, IAM, STS, SSM and Service Quotas calls are judged on the resource "*": a statement
   scoped to narrower resources does not match them (stricter than AWS, never looser).
   sts:GetCallerIdentity needs no permission (STS API Reference, GetCallerIdentity: "No
   permissions are required to perform this operation"). A refusal is each service's own
   shape: EC2 `403 UnauthorizedOperation` ("You are not authorized to perform this operation.
   User: ... is not authorized to perform: ec2:RunInstances on resource: ... Encoded
   authorization failure message: ...", as EC2 answers since it names the action, e.g.
   github.com/aws/karpenter-provider-aws/issues/7370), IAM and STS `403 AccessDenied` ("User:
   ... is not authorized to perform: iam:CreateRole on resource: ... because no identity-based
   policy allows the iam:CreateRole action"), JSON services `AccessDeniedException`, S3
   `403 AccessDenied`;
3. answers what moto lacks, with botocore's service-model shapes (data/service-quotas,
   data/iam): Service Quotas' GetServiceQuota and ListServiceQuotas for service code `ec2`
   (moto 5.2.1 knows only `vpc`), and IAM's SimulatePrincipalPolicy (moto has none), from the
   same policies as step 2, so the simulator and the refusal cannot disagree;
4. refuses an EC2 RunInstances that would exceed a vCPU quota of its region (`400
   VcpuLimitExceeded` on demand, "You have requested more vCPU capacity than your current vCPU
   limit of N allows for the instance bucket that the specified instance type belongs to...";
   `400 MaxSpotInstanceCountExceeded` "Max spot instance count exceeded" on spot), or that
   targets a sold-out zone (`500 InsufficientInstanceCapacity`, a server error per the EC2
   API Reference's "Error codes": "We currently do not have sufficient <type> capacity in the
   Availability Zone you requested (<zone>)..."), every time until the zone is restored.

Unsigned requests (moto's own /moto-api) pass unchanged.
"""

from __future__ import annotations

import base64
import hmac
import io
import json
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any

from tests.fakes.aws_account import QUOTAS, USAGE_CLASS, AwsAccount, quota_code, vcpus_of
from tests.fakes.iam_policy_eval import decision
from tests.fakes.s3_authorizer import _between, _error_xml, _signature_ok, judge

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
IAM_NS = "https://iam.amazonaws.com/doc/2010-05-08/"
STS_NS = "https://sts.amazonaws.com/doc/2011-06-15/"
SERVICE_NAME = "Amazon Elastic Compute Cloud (Amazon EC2)"
Answer = tuple[int, list[tuple[str, str]], bytes]


def owner_arn() -> str:
    """The box key's ARN: what moto's GetCallerIdentity answers for a key it did not issue
    (moto/sts/models.py, get_caller_identity)."""
    from moto.core import DEFAULT_ACCOUNT_ID

    return f"arn:aws:sts::{DEFAULT_ACCOUNT_ID}:user/moto"


class AccountFront:
    """WSGI middleware: the module docstring's four steps before `app`. Thread-safe."""

    def __init__(self, app: App, account: AwsAccount) -> None:
        self.app = app
        self.account = account

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Any:
        answer = self._answer(environ)
        if answer is None:
            return self.app(environ, start_response)
        status, headers, body = answer
        reason = {200: "OK", 400: "Bad Request", 403: "Forbidden", 500: "Internal Server Error"}
        headers = [*headers, ("Content-Length", str(len(body)))]
        start_response(f"{status} {reason.get(status, 'Error')}", headers)
        return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else body]

    def _answer(self, environ: dict[str, Any]) -> Answer | None:
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return None
        key_id, _, scope = _between(auth, "Credential=", ",").partition("/")
        parts = scope.split("/")
        if len(parts) < 3:
            return None
        region, service = parts[1], parts[2]
        body = _body(environ)
        caller = _caller(key_id, self.account)
        if caller is None:
            return None  # an assumed role's key: s3_authorizer judges its S3
        arn, policies, secret = caller
        if secret is not None and not _signed(environ, auth, body, key_id, secret, region):
            return _refusal(service, "SignatureDoesNotMatch", _SIGNATURE)
        params = _params(environ, body)
        for action, resource, context in _requests(environ, service, params):
            verdict = decision(policies, action, resource, context)
            if verdict != "allowed":
                why = (
                    "with an explicit deny in an identity-based policy"
                    if verdict == "explicitDeny"
                    else f"because no identity-based policy allows the {action} action"
                )
                text = f"User: {arn} is not authorized to perform: {action} on resource: "
                text += f"{resource} {why}"
                self.account.refused.append(("AccessDenied", region, text))
                return _denied(service, text, resource)
        if service == "servicequotas":
            return self._quotas(region, environ, params)
        if service == "iam" and params.get("Action") == "SimulatePrincipalPolicy":
            return self._simulate(params)
        if service == "ec2" and params.get("Action") == "RunInstances":
            return self._run_instances(region, params)
        return None

    def _run_instances(self, region: str, params: dict[str, str]) -> Answer | None:
        itype = params.get("InstanceType", "m1.small")
        count = int(params.get("MinCount", "1") or 1)
        spot = params.get("InstanceMarketOptions.MarketType") == "spot"
        code = quota_code(itype, spot)
        if code is not None:
            limit = self.account.limit(region, code)
            wanted = self.account.usage(region, code) + count * vcpus_of(itype)
            if wanted > limit:
                self.account.refused.append((code, region, itype))
                if spot:
                    return _ec2_error(400, "MaxSpotInstanceCountExceeded", _SPOT_QUOTA)
                return _ec2_error(400, "VcpuLimitExceeded", _VCPU_QUOTA.format(int(limit)))
        zone = params.get("Placement.AvailabilityZone") or _subnet_zone(region, params)
        if zone and self.account.is_sold_out(zone):
            self.account.refused.append(("InsufficientInstanceCapacity", zone, itype))
            return _ec2_error(500, "InsufficientInstanceCapacity", _CAPACITY.format(itype, zone))
        return None

    def _quotas(
        self, region: str, environ: dict[str, Any], params: dict[str, str]
    ) -> Answer | None:
        operation = environ.get("HTTP_X_AMZ_TARGET", "").rsplit(".", 1)[-1]
        if params.get("ServiceCode") != "ec2":
            return None  # moto answers `vpc` (and NoSuchResourceException for the rest)
        if operation == "ListServiceQuotas":
            quotas = [self._quota(region, code) for code in QUOTAS]
            return _json(200, {"Quotas": quotas})
        if operation == "GetServiceQuota":
            code = params.get("QuotaCode", "")
            if code not in QUOTAS:
                return _json_error("NoSuchResourceException", f"The quota {code} does not exist.")
            return _json(200, {"Quota": self._quota(region, code)})
        return None

    def _quota(self, region: str, code: str) -> dict[str, Any]:
        """One ServiceQuota (botocore's service-quotas model, shape ServiceQuota)."""
        from moto.core import DEFAULT_ACCOUNT_ID

        name, klass, spot = QUOTAS[code]
        return {
            "ServiceCode": "ec2",
            "ServiceName": SERVICE_NAME,
            "QuotaArn": f"arn:aws:servicequotas:{region}:{DEFAULT_ACCOUNT_ID}:ec2/{code}",
            "QuotaCode": code,
            "QuotaName": name,
            "Value": self.account.limit(region, code),
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
            "UsageMetric": {
                "MetricNamespace": "AWS/Usage",
                "MetricName": "ResourceCount",
                "MetricDimensions": {
                    "Class": USAGE_CLASS[(klass, spot)],
                    "Resource": "vCPU",
                    "Service": "EC2",
                    "Type": "Resource",
                },
                "MetricStatisticRecommendation": "Maximum",
            },
            "QuotaAppliedAtLevel": "ACCOUNT",
        }

    def _simulate(self, params: dict[str, str]) -> Answer:
        """SimulatePrincipalPolicy (IAM API Reference; botocore's iam model: EvaluationResult)
        for a user of moto's IAM, a role, or the box key's ARN."""
        source = params.get("PolicySourceArn", "")
        policies = _policies_of(source, self.account)
        if policies is None:
            text = f"The principal {source} does not exist."
            return _xml_error(404, IAM_NS, "NoSuchEntity", text)
        actions = _members(params, "ActionNames")
        resources = _members(params, "ResourceArns") or ["*"]
        results = ""
        for action in actions:
            for resource in resources:
                verdict = decision(policies, action, resource, {})
                results += (
                    f"<member><EvalActionName>{_esc(action)}</EvalActionName>"
                    f"<EvalResourceName>{_esc(resource)}</EvalResourceName>"
                    f"<EvalDecision>{verdict}</EvalDecision><MatchedStatements/>"
                    "<MissingContextValues/></member>"
                )
        body = (
            f'<SimulatePrincipalPolicyResponse xmlns="{IAM_NS}"><SimulatePrincipalPolicyResult>'
            f"<IsTruncated>false</IsTruncated><EvaluationResults>{results}</EvaluationResults>"
            "</SimulatePrincipalPolicyResult><ResponseMetadata>"
            f"<RequestId>{uuid.uuid4()}</RequestId></ResponseMetadata>"
            "</SimulatePrincipalPolicyResponse>"
        )
        return 200, [("Content-Type", "text/xml")], body.encode()


_SIGNATURE = (
    "The request signature we calculated does not match the signature you provided. Check your"
    " AWS Secret Access Key and signing method. Consult the service documentation for details."
)
_VCPU_QUOTA = (
    "You have requested more vCPU capacity than your current vCPU limit of {} allows for the"
    " instance bucket that the specified instance type belongs to. Please visit"
    " http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit."
)
_SPOT_QUOTA = "Max spot instance count exceeded"
_CAPACITY = (
    "We currently do not have sufficient {0} capacity in the Availability Zone you requested"
    " ({1}). Our system will be working on provisioning additional capacity. You can currently"
    " get {0} capacity by not specifying an Availability Zone in your request or choosing"
    " another Availability Zone."
)


def _body(environ: dict[str, Any]) -> bytes:
    """The request's body, put back for the app behind."""
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    environ["wsgi.input"] = io.BytesIO(body)
    return body


def _params(environ: dict[str, Any], body: bytes) -> dict[str, str]:
    """A query-protocol request's parameters (form body or query string), or a JSON body's
    top-level strings."""
    if "json" in environ.get("CONTENT_TYPE", ""):
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return {}
        return {k: v for k, v in data.items() if isinstance(v, str)}
    text = body.decode(errors="replace") if body else environ.get("QUERY_STRING", "")
    return {k: v[0] for k, v in urllib.parse.parse_qs(text, keep_blank_values=True).items()}


def _members(params: dict[str, str], name: str) -> list[str]:
    keys = sorted(
        (k for k in params if k.startswith(f"{name}.member.")),
        key=lambda k: int(k.rsplit(".", 1)[1]),
    )
    return [params[k] for k in keys]


def _requests(
    environ: dict[str, Any], service: str, params: dict[str, str]
) -> list[tuple[str, str, dict[str, str]]]:
    """(IAM action, resource, condition keys) the request needs."""
    if service == "s3":
        query = urllib.parse.parse_qs(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        return judge(environ, query)
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    operation = target.rsplit(".", 1)[-1] if target else params.get("Action", "")
    if (service, operation) == ("sts", "GetCallerIdentity") or not operation:
        return []
    return [(f"{service}:{operation}", "*", {})]


def _caller(
    key_id: str, account: AwsAccount
) -> tuple[str, list[dict[str, Any]], str | None] | None:
    """(ARN, identity policies, secret to check the signature with) of the key's owner: an IAM
    user of moto's, or the box's own key (no secret checked: the box signs with a dummy);
    None for an assumed role's key."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    from tests.fakes.s3_authorizer import _assumed_role

    if _assumed_role(key_id) is not None:
        return None
    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    user = iam.get_user_from_access_key_id(key_id)
    if user is None:
        return owner_arn(), account.owner_policies(), None
    secret = next(k.secret_access_key for k in user.access_keys if k.access_key_id == key_id)
    return user.arn, _user_policies(user), secret


def _policies_of(arn: str, account: AwsAccount) -> list[dict[str, Any]] | None:
    """The identity policies of the principal `arn` (a user or role of moto's IAM, or the box
    key's ARN); None when there is none."""
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends

    from tests.fakes.s3_authorizer import _role_policies

    if arn == owner_arn():
        return account.owner_policies()
    iam = iam_backends[DEFAULT_ACCOUNT_ID]["aws"]
    user = next((u for u in iam.users.values() if u.arn == arn), None)
    if user is not None:
        return _user_policies(user)
    return _role_policies(arn)


def _user_policies(user: Any) -> list[dict[str, Any]]:
    docs = [json.loads(d) for d in user.policies.values()]
    for managed in user.managed_policies.values():
        docs += [json.loads(v.document) for v in managed.versions if v.is_default_version]
    return docs


def _signed(
    environ: dict[str, Any], auth: str, body: bytes, key_id: str, secret: str, region: str
) -> bool:
    """Whether the request's SigV4 signature is the one botocore computes with `secret`."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    service = _between(auth, "Credential=", ",").split("/")[3]
    token = environ.get("HTTP_X_AMZ_SECURITY_TOKEN", "")
    keys = SimpleNamespace(
        access_key_id=key_id, secret_access_key=secret, session_token=token or None
    )
    if service == "s3":
        return _signature_ok(environ, auth, keys, region)
    signed = _between(auth, "SignedHeaders=", ",").split(";")
    headers = {name: _header(environ, name) for name in signed}
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI") or environ.get("PATH_INFO", "/")
    request = AWSRequest(
        method=environ.get("REQUEST_METHOD", "POST"),
        url=f"http://{environ.get('HTTP_HOST', '')}{raw}",
        headers=headers,
        data=body,
    )
    request.context["timestamp"] = headers.get("x-amz-date", "")
    signer = SigV4Auth(Credentials(key_id, secret, token or None), service, region)
    canonical = signer.canonical_request(request)
    wanted = signer.signature(signer.string_to_sign(request, canonical), request)
    return hmac.compare_digest(wanted, auth.split("Signature=", 1)[-1].strip())


def _header(environ: dict[str, Any], name: str) -> str:
    if name in ("content-type", "content-length"):
        return str(environ.get(name.upper().replace("-", "_"), ""))
    return str(environ.get("HTTP_" + name.upper().replace("-", "_"), ""))


def _subnet_zone(region: str, params: dict[str, str]) -> str | None:
    subnet = params.get("SubnetId") or params.get("NetworkInterface.1.SubnetId")
    if not subnet:
        return None
    from moto.core import DEFAULT_ACCOUNT_ID
    from moto.ec2.models import ec2_backends

    try:
        return str(ec2_backends[DEFAULT_ACCOUNT_ID][region].get_subnet(subnet).availability_zone)
    except Exception:  # moto answers the unknown subnet itself
        return None


def _denied(service: str, text: str, resource: str) -> Answer:
    if service == "ec2":
        blob = base64.urlsafe_b64encode(uuid.uuid4().bytes * 4).decode().rstrip("=")
        message = f"You are not authorized to perform this operation. {text}. "
        return _ec2_error(
            403, "UnauthorizedOperation", message + f"Encoded authorization failure message: {blob}"
        )
    if service == "s3":
        return (
            403,
            [("Content-Type", "application/xml")],
            _error_xml("AccessDenied", text, resource),
        )
    return _refusal(service, "AccessDenied", text)


def _refusal(service: str, code: str, text: str) -> Answer:
    """`code` in the service's own protocol (EC2 query, IAM/STS query, JSON, S3 XML)."""
    if service == "ec2":
        return _ec2_error(403, code, text)
    if service in ("iam", "sts"):
        return _xml_error(403, IAM_NS if service == "iam" else STS_NS, code, text)
    if service == "s3":
        return 403, [("Content-Type", "application/xml")], _error_xml(code, text, "")
    json_code = {"AccessDenied": "AccessDeniedException"}.get(code, code)
    return _json_error(json_code, text)


def _ec2_error(status: int, code: str, message: str) -> Answer:
    """EC2's error response (EC2 API Reference, "Error codes": Response/Errors/Error)."""
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{code}</Code><Message>{_esc(message)}</Message>"
        f"</Error></Errors><RequestID>{uuid.uuid4()}</RequestID></Response>"
    )
    return status, [("Content-Type", "text/xml")], body.encode()


def _xml_error(status: int, namespace: str, code: str, message: str) -> Answer:
    """The query protocol's ErrorResponse (IAM, STS)."""
    body = (
        f'<ErrorResponse xmlns="{namespace}"><Error><Type>Sender</Type><Code>{code}</Code>'
        f"<Message>{_esc(message)}</Message></Error><RequestId>{uuid.uuid4()}</RequestId>"
        "</ErrorResponse>"
    )
    return status, [("Content-Type", "text/xml")], body.encode()


def _json(status: int, data: dict[str, Any]) -> Answer:
    return status, [("Content-Type", "application/x-amz-json-1.1")], json.dumps(data).encode()


def _json_error(code: str, message: str) -> Answer:
    """The JSON 1.1 protocol's error: `__type` and `Message`, HTTP 400."""
    status, headers, body = _json(400, {"__type": code, "Message": message})
    return status, [*headers, ("x-amzn-ErrorType", code)], body


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
