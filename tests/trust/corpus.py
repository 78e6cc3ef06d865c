"""A synthetic corpus of credentials in their real shapes, and of benign ids that must survive.

Every value is generated here from a fixed seed (never a real key): the shape each issuer gives
its credentials (prefix, alphabet, length), filled with random characters. `SECRETS` holds one
or more samples per rule of the pack; `in_context` says how a format appears in real text (an
AWS secret key only next to its name). `BENIGN` holds the ids agents and APIs print everywhere.
"""

from __future__ import annotations

import base64
import random
import string
from dataclasses import dataclass

__all__ = ["BENIGN", "SECRETS", "Sample", "embeddings"]

_RANDOM = random.Random(20261201)
ALNUM = string.ascii_letters + string.digits
HEX = "0123456789abcdef"
B64 = ALNUM + "+/"
URLSAFE = ALNUM + "-_"
BASE32 = string.ascii_uppercase + "234567"


def _r(alphabet: str, length: int) -> str:
    return "".join(_RANDOM.choice(alphabet) for _ in range(length))


def _mixed(alphabet: str, length: int) -> str:
    """Random text holding each character class (lower, upper, digit) its alphabet has."""
    classes = [test for test in (str.islower, str.isupper, str.isdigit) if any(test(c) for c in alphabet)]
    while True:
        value = _r(alphabet, length)
        if all(any(test(c) for c in value) for test in classes):
            return value


@dataclass(frozen=True)
class Sample:
    """One credential: its rule, the secret text, and the text around it that real use puts there."""

    rule_id: str
    secret: str
    template: str = "{secret}"

    def in_context(self) -> str:
        return self.template.format(secret=self.secret)


def _pem(kind: str) -> str:
    body = base64.b64encode(_RANDOM.randbytes(300)).decode()
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return f"-----BEGIN {kind}PRIVATE KEY-----\n" + "\n".join(lines) + f"\n-----END {kind}PRIVATE KEY-----"


def _jwt() -> str:
    def part(value: bytes) -> str:
        return base64.urlsafe_b64encode(value).decode().rstrip("=")

    header = part(b'{"alg":"HS256","typ":"JWT"}')
    payload = part(b'{"sub":"' + _r(ALNUM, 12).encode() + b'","iat":1733011200,"scope":"admin"}')
    return f"{header}.{payload}.{part(_RANDOM.randbytes(32))}"


SECRETS: tuple[Sample, ...] = (
    Sample("openai-project-key", "sk-proj-" + _mixed(URLSAFE, 74) + "T3BlbkFJ" + _mixed(URLSAFE, 74)),
    Sample("openai-project-key", "sk-proj-" + _mixed(ALNUM, 48)),
    Sample("openai-service-account-key", "sk-svcacct-" + _mixed(URLSAFE, 74) + "T3BlbkFJ" + _mixed(URLSAFE, 74)),
    Sample("openai-admin-key", "sk-admin-" + _mixed(URLSAFE, 74) + "T3BlbkFJ" + _mixed(URLSAFE, 74)),
    Sample("openai-legacy-key", "sk-" + _mixed(ALNUM, 20) + "T3BlbkFJ" + _mixed(ALNUM, 20)),
    Sample("openai-legacy-key", "sk-" + _mixed(ALNUM, 48)),
    Sample("anthropic-api-key", "sk-ant-api03-" + _mixed(URLSAFE, 93) + "AA"),
    Sample("anthropic-admin-key", "sk-ant-admin01-" + _mixed(URLSAFE, 93) + "AA"),
    Sample("anthropic-oauth-token", "sk-ant-oat01-" + _mixed(URLSAFE, 93) + "AA"),
    Sample("openrouter-api-key", "sk-or-v1-" + _r(HEX, 64)),
    Sample("deepseek-api-key", "sk-" + _r(HEX, 32)),
    Sample("aws-access-key-id", "AKIA" + _r(BASE32, 16)),
    Sample("aws-access-key-id", "ASIA" + _r(BASE32, 16)),
    Sample("aws-secret-access-key", _mixed(B64, 40), "aws_secret_access_key = {secret}"),
    Sample("aws-secret-access-key", _mixed(B64, 40), "AWS_SECRET_ACCESS_KEY={secret}"),
    Sample("aws-session-token", "IQoJb3JpZ2luX2Vj" + _mixed(B64, 300), "AWS_SESSION_TOKEN={secret}"),
    Sample("aws-bedrock-api-key", "ABSK" + base64.b64encode(b"BedrockAPIKey-" + _RANDOM.randbytes(96)).decode()),
    Sample(
        "aws-bedrock-short-term-key",
        "bedrock-api-key-"
        + base64.b64encode(b"bedrock.amazonaws.com/?Action=CallWithBearerToken&" + _RANDOM.randbytes(200)).decode(),
    ),
    Sample("github-pat-classic", "ghp_" + _mixed(ALNUM, 36)),
    Sample("github-oauth-token", "gho_" + _mixed(ALNUM, 36)),
    Sample("github-user-app-token", "ghu_" + _mixed(ALNUM, 36)),
    Sample("github-app-installation-token", "ghs_" + _mixed(ALNUM, 36)),
    Sample("github-refresh-token", "ghr_" + _mixed(ALNUM, 76)),
    Sample("github-fine-grained-pat", "github_pat_" + _mixed(ALNUM, 22) + "_" + _mixed(ALNUM, 59)),
    Sample("gitlab-pat", "glpat-" + _mixed(URLSAFE, 20)),
    Sample("gitlab-runner-token", "glrt-" + _mixed(URLSAFE, 20)),
    Sample("gitlab-deploy-token", "gldt-" + _mixed(URLSAFE, 20)),
    Sample("slack-bot-token", f"xoxb-{_r(string.digits, 12)}-{_r(string.digits, 13)}-{_mixed(ALNUM, 24)}"),
    Sample(
        "slack-user-token",
        f"xoxp-{_r(string.digits, 12)}-{_r(string.digits, 12)}-{_r(string.digits, 13)}-{_r(HEX, 32)}",
    ),
    Sample(
        "slack-app-token",
        f"xapp-1-A{_r(string.ascii_uppercase + string.digits, 10)}-{_r(string.digits, 13)}-{_r(HEX, 64)}",
    ),
    Sample(
        "slack-webhook-url",
        f"hooks.slack.com/services/T{_r(BASE32, 10)}/B{_r(BASE32, 10)}/{_mixed(ALNUM, 24)}",
        "https://{secret}",
    ),
    Sample("stripe-secret-key", "sk_live_" + _mixed(ALNUM, 99)),
    Sample("stripe-secret-key", "sk_test_" + _mixed(ALNUM, 24)),
    Sample("stripe-restricted-key", "rk_live_" + _mixed(ALNUM, 99)),
    Sample("stripe-webhook-secret", "whsec_" + _mixed(ALNUM, 32)),
    Sample("google-api-key", "AIza" + _mixed(URLSAFE, 35)),
    Sample("google-oauth-client-secret", "GOCSPX-" + _mixed(URLSAFE, 28)),
    Sample("huggingface-token", "hf_" + _mixed(string.ascii_letters, 34)),
    Sample("huggingface-org-token", "api_org_" + _mixed(string.ascii_letters, 34)),
    Sample("groq-api-key", "gsk_" + _mixed(ALNUM, 52)),
    Sample("xai-api-key", "xai-" + _mixed(ALNUM, 80)),
    Sample("perplexity-api-key", "pplx-" + _mixed(ALNUM, 48)),
    Sample("replicate-api-token", "r8_" + _mixed(ALNUM, 37)),
    Sample("langsmith-api-key", f"lsv2_pt_{_r(HEX, 32)}_{_r(HEX, 10)}"),
    Sample("langsmith-api-key", f"lsv2_sk_{_r(HEX, 32)}_{_r(HEX, 10)}"),
    Sample("langfuse-secret-key", f"sk-lf-{_r(HEX, 8)}-{_r(HEX, 4)}-{_r(HEX, 4)}-{_r(HEX, 4)}-{_r(HEX, 12)}"),
    Sample("npm-token", "npm_" + _mixed(ALNUM, 36)),
    Sample("pypi-token", "pypi-AgEIcHlwaS5vcmc" + _mixed(URLSAFE, 130)),
    Sample("sendgrid-api-key", f"SG.{_mixed(URLSAFE, 22)}.{_mixed(URLSAFE, 43)}"),
    Sample("twilio-api-key", "SK" + _r(HEX, 32)),
    Sample("twilio-auth-token", _r(HEX, 32), "TWILIO_AUTH_TOKEN={secret}"),
    Sample("databricks-token", "dapi" + _r(HEX, 32)),
    Sample("digitalocean-token", "dop_v1_" + _r(HEX, 64)),
    Sample("digitalocean-token", "doo_v1_" + _r(HEX, 64)),
    Sample("vault-token", "hvs." + _mixed(URLSAFE, 90)),
    Sample("vault-token", "hvb." + _mixed(URLSAFE, 120)),
    Sample("shopify-token", "shpat_" + _r(HEX, 32)),
    Sample("shopify-token", "shpss_" + _r(HEX, 32)),
    Sample("linear-api-key", "lin_api_" + _mixed(ALNUM, 40)),
    Sample("docker-hub-pat", "dckr_pat_" + _mixed(URLSAFE, 27)),
    Sample("pulumi-access-token", "pul-" + _r(HEX, 40)),
    Sample(
        "azure-storage-connection-string",
        base64.b64encode(_RANDOM.randbytes(64)).decode(),
        "DefaultEndpointsProtocol=https;AccountName=llmtapstore;AccountKey={secret};EndpointSuffix=core.windows.net",
    ),
    Sample("jwt", _jwt()),
    Sample("private-key-pem", _pem("RSA ")),
    Sample("private-key-pem", _pem("OPENSSH ")),
    Sample("private-key-pem", _pem("")),
    Sample("password-in-url", "Zq8" + _mixed(ALNUM, 13), "postgres://app_user:{secret}@db.internal:5432/app"),
    Sample("password-in-url", _mixed(ALNUM, 12) + "!x", "https://deploy:{secret}@git.example.org/repo.git"),
    Sample("bearer-token", _mixed(URLSAFE + ".", 40), "Authorization: Bearer {secret}"),
    Sample("generic-secret-assignment", _mixed(ALNUM, 20), "DB_PASSWORD={secret}"),
    Sample("generic-secret-assignment", _mixed(ALNUM + "!@#%^&*", 18), 'password: "{secret}"'),
    Sample("generic-secret-assignment", _mixed(ALNUM, 32), "api_key = '{secret}'"),
    Sample("generic-secret-assignment", _mixed(ALNUM, 24), "client_secret={secret}"),
)

# Ids and digests agents and APIs print everywhere: none may ever be changed.
BENIGN: tuple[str, ...] = (
    "550e8400-e29b-41d4-a716-446655440000",
    "6F9619FF-8B86-D011-B42D-00C04FC964FF",
    "3f786850e387550fdab836ed7e6dc881de23001b",  # git SHA-1
    "9b74c98",  # short git SHA
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",  # SHA-256 of nothing
    "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "sha512-z4PhNX7vuL3xVChQ1m2AB9Yg5AULVxXcg/SpIdNs6c5H0NE8XYXysP+DGNKHfuwvY7kxvUdBeoGlODJ6+SfaPg==",
    "sha384-oqVuAfXRKap7fdgcCY5uykM6+R9GqQ8K/uxy9rx7HNQlGYl1kPzQho1wx4JwY8wC",
    "d41d8cd98f00b204e9800998ecf8427e",  # MD5
    "chatcmpl-AqG6cF5Y3J1fWmVbxN2RkT8sZ0pL",
    "resp_67ccd3a9da748190baa7f1570fe91ac604becb25c45fab3b",
    "msg_01XFDUDYJgAACzvnptvVoYEL",
    "call_kX9vTz3Yd2Qh8LmN1oPa4RsU",
    "toolu_01A09q90qw90lq917835lq9",
    "fc_68a1c2d3e4f5a6b7c8d9e0f1a2b3c4d5",
    "rs_68a1c2d3e4f5a6b7c8d9e0f1a2b3c4d5e6f7",
    "01ARZ3NDEKTSV4RRFFQ69G5FAV",  # ULID
    "01JE8Z7Q4X2K9M3N5P6R7S8T9V",
    "AKIAIOSFODNN7EXAMPLE",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "${OPENAI_API_KEY}",
    "{{ secrets.GITHUB_TOKEN }}",
    "sk-...",
    "<your-api-key>",
    "sha1:0beec7b5ea3f0fdbc95d0dd47f3c5bc275da8a33",
    "data:image/png;base64,"
    + base64.b64encode(
        b"\x89PNG\r\n\x1a\n" + b"ghp_AKIAsk-proj-" + random.Random(7).randbytes(6000) + b"eyJhbGciOi.eyJzdWIi.sig"
    ).decode(),
)


def embeddings(text: str) -> dict[str, str]:
    """The places a credential turns up in an agent's traffic, as plain text around `text`."""
    return {
        "prompt": f"Here is my config, please debug it:\n{text}\nWhy does the call fail?",
        "env_file": f"# .env\nDEBUG=1\n{text}\nREGION=eu-west-1\n",
        "log_line": f"2026-12-01T20:00:00Z INFO connecting with {text} (attempt 2)",
        "url_query": f"https://api.example.com/v1/items?id=42&key={text}&page=2",
    }
