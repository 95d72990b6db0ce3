"""The Queue admission webhook every scheduler replica serves, and the certificate it serves with.

The certificate and its CA live in one Secret, so every replica serves the same one: the first to start
makes it (a create is atomic; a replica that loses the race reads the winner's). Each replica writes the
CA into the caBundle of the ValidatingWebhookConfiguration the admin installed, where it differs, so the
API server trusts it. The scheduler may update that one object (RBAC ``resourceNames``), never register
webhooks of its own. The configuration fails open (``failurePolicy: Ignore``): with no replica up, Queue
changes are admitted and the scheduler ignores the links that cannot stand, as it does without a webhook.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from cryptography import x509
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from ferry import certs
from ferry.kube.informer import Obj
from scheduler.service.admission import review_response

log = structlog.get_logger("ferry.webhook")
PATH = "/validate-queues"
CA, CERT, KEY = "ca.crt", "tls.crt", "tls.key"


@dataclass(frozen=True)
class ServingCert:
    ca: bytes
    cert: bytes
    key: bytes


def make_serving_cert(hosts: tuple[str, ...]) -> ServingCert:
    ca = certs.new_ca("kube-ferry-webhook-ca")
    dns, ips = certs.split_hosts(hosts)
    leaf = certs.issue(ca, hosts[0], dns=dns, ips=ips, server=True)
    return ServingCert(certs.cert_pem(ca.cert), certs.cert_pem(leaf.cert), certs.key_pem(leaf.key))


def missing_hosts(cert_pem: bytes, hosts: tuple[str, ...]) -> list[str]:
    """The hosts a certificate does not name (the API server would refuse it for them)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return list(hosts)
    named = {str(n) for n in alt.get_values_for_type(x509.DNSName)}
    named |= {str(ip) for ip in alt.get_values_for_type(x509.IPAddress)}
    return [h for h in hosts if h not in named]


async def ensure_serving_secret(core: client.CoreV1Api, namespace: str, name: str,
                                hosts: tuple[str, ...]) -> ServingCert:
    """The serving certificate kept in Secret ``namespace/name``, made (and stored) if there is none."""
    for _ in range(3):
        try:
            secret = await core.read_namespaced_secret(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            made = make_serving_cert(hosts)
            body = {"metadata": {"name": name, "namespace": namespace,
                                 "labels": {"app.kubernetes.io/part-of": "kube-ferry"}},
                    "type": "kubernetes.io/tls",
                    "data": {k: base64.b64encode(v).decode() for k, v in
                             ((CA, made.ca), (CERT, made.cert), (KEY, made.key))}}
            try:
                await core.create_namespaced_secret(namespace, body)
            except ApiException as exc2:
                if exc2.status == 409:  # another replica made it first: serve that one
                    continue
                raise
            log.info("webhook certificate made", secret=f"{namespace}/{name}", hosts=list(hosts))
            return made
        data = secret.data or {}
        if not all(data.get(k) for k in (CA, CERT, KEY)):
            raise RuntimeError(f"Secret {namespace}/{name} lacks {CA}, {CERT} or {KEY}: delete it to have a new "
                               "certificate made")
        got = ServingCert(*(base64.b64decode(data[k]) for k in (CA, CERT, KEY)))
        if missing := missing_hosts(got.cert, hosts):
            log.warning("webhook certificate does not name these hosts: delete the Secret to have a new one made",
                        secret=f"{namespace}/{name}", missing=missing)
        return got
    raise RuntimeError(f"Secret {namespace}/{name} kept changing while read")


async def publish_ca(admission: client.AdmissionregistrationV1Api, configuration: str, ca: bytes) -> bool:
    """Write ``ca`` into every webhook's caBundle of the named ValidatingWebhookConfiguration; whether it
    is there now (False: the configuration is not installed)."""
    bundle = base64.b64encode(ca).decode()
    for _ in range(3):
        try:
            vwc = await admission.read_validating_webhook_configuration(configuration)
        except ApiException as exc:
            if exc.status == 404:
                log.warning("webhook configuration not installed: Queue links are checked by the scheduler only",
                            configuration=configuration)
                return False
            raise
        stale = [w for w in vwc.webhooks or () if w.client_config.ca_bundle != bundle]
        if not stale:
            return True
        for w in stale:
            w.client_config.ca_bundle = bundle
        try:
            await admission.replace_validating_webhook_configuration(configuration, vwc)
        except ApiException as exc:
            if exc.status == 409:  # changed meanwhile: read again
                continue
            raise
        log.info("webhook CA published", configuration=configuration)
        return True
    return False


def server_context(serving: ServingCert) -> ssl.SSLContext:
    """A TLS server context for the certificate (the ssl module loads keys from files only)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    with tempfile.TemporaryDirectory(prefix="ferry-webhook-") as d:
        cert, key = Path(d) / CERT, Path(d) / KEY
        cert.write_bytes(serving.cert)
        key.touch(mode=0o600)
        key.write_bytes(serving.key)
        ctx.load_cert_chain(cert, key)
    return ctx


def make_app(list_queues: Callable[[], Awaitable[Mapping[str, Obj]]]) -> web.Application:
    """POST ``/validate-queues``: an AdmissionReview in, its answer out. The Queues are read live, not
    from the informer cache: a parent created a moment before its child must count."""

    async def validate(request: web.Request) -> web.Response:
        try:
            review: dict[str, Any] = await request.json()
        except ValueError:
            return web.json_response({"error": "not an AdmissionReview"}, status=400)
        try:
            queues = await list_queues()
        except Exception as exc:  # fail open, as the configuration does, and say so to whoever wrote it
            uid = (review.get("request") or {}).get("uid", "")
            log.warning("queue check skipped: cannot list queues", error=str(exc)[:200])
            return web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
                "uid": uid, "allowed": True, "warnings": ["kube-ferry could not check the queue tree; the scheduler "
                                                          "will ignore a parent link that cannot stand"]}})
        answer = review_response(review, queues)
        if not answer["response"]["allowed"]:
            req = review.get("request") or {}
            log.info("queue change refused", operation=req.get("operation"), queue=req.get("name"),
                     reason=answer["response"]["status"]["message"])
        return web.json_response(answer)

    app = web.Application(client_max_size=1 << 20)
    app.router.add_post(PATH, validate)
    return app


def live_queues(api: client.ApiClient) -> Callable[[], Awaitable[dict[str, Obj]]]:
    custom = client.CustomObjectsApi(api)

    async def fetch() -> dict[str, Obj]:
        listed = await custom.list_cluster_custom_object("scheduling.kubeferry.io", "v1alpha1", "queues")
        return {str(q["metadata"]["name"]): q for q in listed.get("items", ())}

    return fetch


@dataclass(frozen=True)
class WebhookConfig:
    port: int
    address: str
    secret: tuple[str, str]  # namespace, name
    configuration: str  # the ValidatingWebhookConfiguration whose caBundle to keep; "" to leave it alone
    hosts: tuple[str, ...]  # names the API server reaches the webhook by (the Service's, or an address)


async def start_webhook(api: client.ApiClient, config: WebhookConfig) -> web.AppRunner:
    """Make or read the certificate, publish its CA, and serve; the runner's cleanup stops it."""
    serving = await ensure_serving_secret(client.CoreV1Api(api), *config.secret, config.hosts)
    if config.configuration:
        await publish_ca(client.AdmissionregistrationV1Api(api), config.configuration, serving.ca)
    runner = web.AppRunner(make_app(live_queues(api)), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.address, config.port, ssl_context=server_context(serving)).start()
    log.info("webhook serving", address=config.address, port=config.port, path=PATH)
    return runner


async def serve_webhook(api: client.ApiClient, config: WebhookConfig, max_backoff_s: float = 30.0) -> None:
    """Serve until cancelled. While the certificate cannot be had or the port bound (the API server down,
    no rights yet, a bad Secret) try again with back-off, saying why: the scheduler schedules meanwhile,
    and the configuration fails open."""
    backoff = 0.5
    while True:
        try:
            runner = await start_webhook(api, config)
            break
        except Exception as exc:  # API, RBAC or bind failures alike: none is fixed by giving up
            log.warning("Queue webhook not served yet; retrying", error=str(exc)[:300], in_s=backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, max_backoff_s)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
