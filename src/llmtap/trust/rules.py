"""The secret rule pack: one entry per credential format, with the shape its issuer gives it.

Each rule names a format by id (the `<rule-id>` in `[REDACTED:<rule-id>]`), the literal
keywords one of which every match contains (the scanner's prefilter), how far before a keyword a
match may begin and how long it may be (so the scanner only runs a rule's regex on small windows
around its keywords), and optional checks a regex cannot express: a Shannon-entropy floor for
keyword-anchored rules, and whether a value-shaped rule also applies to a JSON value whose key
names a secret.

Deliberately absent: any rule for a bare run of hex, alphanumerics or a UUID. Agents and APIs
print those everywhere (git SHAs, digests, request ids), and a rule for them redacts evidence
while finding no credential with a real shape. Dependency-free: only `re` and `hashlib`.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

__all__ = ["GENERIC_KEY", "RULES", "RULE_PACK_VERSION", "Rule", "rule_pack_digest"]

# Bumped whenever a rule is added, removed or its pattern changes; the digest below pins the exact pack.
RULE_PACK_VERSION = "2026.12.1"

# A token starts where no token character comes before it: inside a base64 or base64url run
# (an image, an integrity string) nothing can start, so a blob never yields a match by chance.
_START = r"(?<![A-Za-z0-9+/_-])"
_END = r"(?![A-Za-z0-9_-])"
_END_B64 = r"(?![A-Za-z0-9+/=])"

# Names that say their value is a secret, in keys, assignments and environment lines.
_SECRET_WORDS = (
    r"password|passwd|passphrase|secrets?|api[_-]?key|apikey|access[_-]?key|auth[_-]?token|access[_-]?token"
    r"|refresh[_-]?token|session[_-]?token|private[_-]?key|client[_-]?secret|credentials?|token"
)
GENERIC_KEY = re.compile(rf"(?i)^[A-Za-z0-9_.-]{{0,40}}(?:{_SECRET_WORDS})$")
"""A key (JSON object key, variable name) that names a secret: the generic rule checks its value."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One credential format.

    `pattern` holds a group named `secret` when only part of a match is the credential (the value
    of an assignment); otherwise the whole match is. Every match contains one of `keywords`
    (lowercase when `ignore_case`), at most `back` characters after the match's start, and is at
    most `max_length` characters long. `entropy_floor` rejects low-entropy values (words,
    placeholders); `value_pattern` is the test a bare JSON value gets when its key names a secret.
    `after_keyword`, matched on the lowercased text right after a keyword, drops keyword
    occurrences that start no assignment (`prompt_tokens`, `monkey`) before any regex runs.
    `loose` marks rules whose values have no fixed shape (generic assignments, bearer tokens, URL
    passwords): a value there that has the shape of a benign id (a UUID, a SHA) is left alone.
    """

    id: str
    description: str
    pattern: re.Pattern[str]
    keywords: tuple[str, ...]
    max_length: int
    back: int = 0
    ignore_case: bool = False
    entropy_floor: float | None = None
    generic: bool = False
    loose: bool = False
    key_pattern: re.Pattern[str] | None = None
    value_pattern: re.Pattern[str] | None = None
    after_keyword: re.Pattern[str] | None = None


# What follows the end of a credential's name in an assignment: a quote (maybe escaped), a separator.
_NAME_END = re.compile(r"\\?[\"']?\s{0,3}(?:[:=]|=>)")
# The same after a generic keyword, which may be followed by the rest of its word (pass-word,
# secret_key): `max_tokens"` and `monkey` stop here, before any regex runs.
_ASSIGNMENT_TAIL = re.compile(r"(?:word|wd|phrase|_?key|_?token)?\\?[\"']?\s{0,3}(?:[:=]|=>)")


def _rule(
    rule_id: str,
    description: str,
    regex: str,
    keywords: tuple[str, ...],
    max_length: int,
    *,
    back: int = 0,
    ignore_case: bool = False,
    entropy_floor: float | None = None,
    generic: bool = False,
    loose: bool = False,
    key_regex: str | None = None,
    value_regex: str | None = None,
) -> Rule:
    flags = re.IGNORECASE if ignore_case else 0
    return Rule(
        rule_id,
        description,
        re.compile(regex, flags),
        keywords,
        max_length,
        back,
        ignore_case,
        entropy_floor,
        generic,
        loose or generic,
        None if key_regex is None else re.compile(key_regex, re.IGNORECASE),
        None if value_regex is None else re.compile(value_regex),
        (_ASSIGNMENT_TAIL if generic else _NAME_END) if value_regex is not None else None,
    )


def _prefixed(rule_id: str, description: str, prefix: str, body: str, max_length: int, end: str = _END) -> Rule:
    """A token that begins with a fixed literal prefix (most modern credentials)."""
    return _rule(rule_id, description, _START + re.escape(prefix) + body + end, (prefix,), max_length)


def _assigned(
    rule_id: str, description: str, names: str, value: str, keywords: tuple[str, ...], max_length: int
) -> Rule:
    """A value that is only a credential next to its name: `NAME = value` in text, or a JSON value
    under a key of that name (`key_pattern`/`value_pattern`)."""
    regex = rf"(?:{names})[\"']?\s{{0,3}}(?:[:=]|=>)\s{{0,3}}[\"']?(?P<secret>{value})"
    return _rule(
        rule_id,
        description,
        regex,
        keywords,
        max_length,
        back=40,
        ignore_case=True,
        key_regex=rf"[A-Za-z0-9_.-]{{0,20}}(?:{names})",
        value_regex=value,
    )


_ASSIGNMENT_VALUE = r"[^\s\"'`,;&{}\[\]()<>]{8,256}"

RULES: tuple[Rule, ...] = (
    # OpenAI: project, service-account and admin keys carry their kind; legacy user keys are
    # sk- plus 48 characters, with the base64 of "OpenAI" (T3BlbkFJ) in the middle since 2023.
    _prefixed("openai-project-key", "OpenAI project API key", "sk-proj-", r"[A-Za-z0-9_-]{40,300}", 320),
    _prefixed("openai-service-account-key", "OpenAI service-account key", "sk-svcacct-", r"[A-Za-z0-9_-]{40,300}", 320),
    _prefixed("openai-admin-key", "OpenAI admin key", "sk-admin-", r"[A-Za-z0-9_-]{40,300}", 320),
    _prefixed(
        "openai-legacy-key",
        "OpenAI user API key (legacy shape)",
        "sk-",
        r"(?:[A-Za-z0-9]{20}T3BlbkFJ[A-Za-z0-9]{20}|[A-Za-z0-9]{48})",
        52,
    ),
    _prefixed("anthropic-api-key", "Anthropic API key", "sk-ant-api0", r"\d-[A-Za-z0-9_-]{80,120}", 140),
    _prefixed("anthropic-admin-key", "Anthropic admin API key", "sk-ant-admin0", r"\d-[A-Za-z0-9_-]{80,120}", 140),
    _prefixed("anthropic-oauth-token", "Anthropic OAuth access token", "sk-ant-oat0", r"\d-[A-Za-z0-9_-]{80,120}", 140),
    _prefixed("openrouter-api-key", "OpenRouter API key", "sk-or-v1-", r"[a-f0-9]{64}", 80),
    _prefixed("deepseek-api-key", "DeepSeek API key", "sk-", r"[a-f0-9]{32}", 40),
    # AWS access key ids: a four-letter kind (AKIA long-term, ASIA session, ...) and 16 base32 characters.
    _rule(
        "aws-access-key-id",
        "AWS access key id",
        _START + r"(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AIPA|ANPA|ANVA|APKA|AROA|ASCA)[A-Z2-7]{16}" + r"(?![A-Za-z0-9])",
        ("AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AIPA", "ANPA", "ANVA", "APKA", "AROA", "ASCA"),
        20,
    ),
    _assigned(
        "aws-secret-access-key",
        "AWS secret access key (next to its name)",
        r"aws_?secret_?access_?key|aws_?secret_?key|secret_?access_?key|aws_?secret",
        r"[A-Za-z0-9/+]{40}" + _END_B64,
        ("access_key", "accesskey", "secret_key", "secretkey", "aws_secret", "awssecret"),
        130,
    ),
    _assigned(
        "aws-session-token",
        "AWS session token (next to its name)",
        r"aws_?session_?token|aws_?security_?token|session_?token",
        r"[A-Za-z0-9/+=]{100,2048}",
        ("session_token", "sessiontoken", "security_token", "securitytoken"),
        2120,
    ),
    _prefixed(
        "aws-bedrock-api-key",
        "Amazon Bedrock long-term API key",
        "ABSK",
        r"[A-Za-z0-9+/]{100,300}={0,2}",
        310,
        _END_B64,
    ),
    _prefixed(
        "aws-bedrock-short-term-key",
        "Amazon Bedrock short-term API key",
        "bedrock-api-key-",
        r"[A-Za-z0-9+/]{100,4000}={0,2}",
        4030,
        _END_B64,
    ),
    _prefixed("github-pat-classic", "GitHub personal access token (classic)", "ghp_", r"[A-Za-z0-9]{36}", 40),
    _prefixed("github-oauth-token", "GitHub OAuth access token", "gho_", r"[A-Za-z0-9]{36}", 40),
    _prefixed("github-user-app-token", "GitHub App user-to-server token", "ghu_", r"[A-Za-z0-9]{36}", 40),
    _prefixed("github-app-installation-token", "GitHub App installation token", "ghs_", r"[A-Za-z0-9]{36}", 40),
    _prefixed("github-refresh-token", "GitHub refresh token", "ghr_", r"[A-Za-z0-9]{36,76}", 80),
    _prefixed(
        "github-fine-grained-pat",
        "GitHub fine-grained personal access token",
        "github_pat_",
        r"[A-Za-z0-9]{22}_[A-Za-z0-9]{59}",
        93,
    ),
    _prefixed("gitlab-pat", "GitLab personal access token", "glpat-", r"[A-Za-z0-9_.-]{20,80}", 90),
    _prefixed("gitlab-runner-token", "GitLab runner authentication token", "glrt-", r"[A-Za-z0-9_.-]{20,80}", 90),
    _prefixed("gitlab-deploy-token", "GitLab deploy token", "gldt-", r"[A-Za-z0-9_.-]{20,80}", 90),
    _prefixed("slack-bot-token", "Slack bot token", "xoxb-", r"[0-9]{8,13}-[0-9]{8,13}-[A-Za-z0-9]{24,34}", 70),
    _prefixed("slack-user-token", "Slack user token", "xoxp-", r"[0-9]{8,13}-[0-9]{8,13}-[0-9]{8,13}-[a-f0-9]{32}", 90),
    _prefixed("slack-app-token", "Slack app-level token", "xapp-", r"\d-[A-Z0-9]{9,11}-\d{10,13}-[a-f0-9]{64}", 100),
    _rule(
        "slack-webhook-url",
        "Slack incoming-webhook URL",
        r"hooks\.slack\.com/(?:services|workflows|triggers)/T[A-Z0-9]{8,12}/[A-Z0-9]{8,12}/[A-Za-z0-9]{20,40}" + _END,
        ("hooks.slack.com/",),
        110,
    ),
    _rule(
        "stripe-secret-key",
        "Stripe secret key",
        _START + r"sk_(?:live|test)_[A-Za-z0-9]{24,247}" + _END,
        ("sk_live_", "sk_test_"),
        260,
    ),
    _rule(
        "stripe-restricted-key",
        "Stripe restricted key",
        _START + r"rk_(?:live|test)_[A-Za-z0-9]{24,247}" + _END,
        ("rk_live_", "rk_test_"),
        260,
    ),
    _prefixed("stripe-webhook-secret", "Stripe webhook signing secret", "whsec_", r"[A-Za-z0-9]{32,64}", 70),
    _prefixed("google-api-key", "Google API key (Gemini, Maps, Firebase)", "AIza", r"[0-9A-Za-z_-]{35}", 39),
    _prefixed("google-oauth-client-secret", "Google OAuth client secret", "GOCSPX-", r"[A-Za-z0-9_-]{28}", 35),
    _prefixed("huggingface-token", "Hugging Face access token", "hf_", r"[A-Za-z0-9]{34,40}", 43),
    _prefixed("huggingface-org-token", "Hugging Face organization token", "api_org_", r"[A-Za-z0-9]{34}", 42),
    _prefixed("groq-api-key", "Groq API key", "gsk_", r"[A-Za-z0-9]{52}", 56),
    _prefixed("xai-api-key", "xAI (Grok) API key", "xai-", r"[A-Za-z0-9]{70,90}", 94),
    _prefixed("perplexity-api-key", "Perplexity API key", "pplx-", r"[A-Za-z0-9]{48}", 53),
    _prefixed("replicate-api-token", "Replicate API token", "r8_", r"[A-Za-z0-9]{37}", 40),
    _prefixed("langsmith-api-key", "LangSmith API key", "lsv2_", r"(?:pt|sk)_[a-f0-9]{32}_[a-f0-9]{10}", 52),
    _prefixed(
        "langfuse-secret-key",
        "Langfuse secret key",
        "sk-lf-",
        r"[a-f0-9]{8}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{4}-[a-f0-9]{12}",
        42,
    ),
    _prefixed("npm-token", "npm access token", "npm_", r"[A-Za-z0-9]{36}", 40),
    _prefixed("pypi-token", "PyPI upload token", "pypi-AgEIcHlwaS5vcmc", r"[A-Za-z0-9_-]{50,400}", 420),
    _prefixed("sendgrid-api-key", "SendGrid API key", "SG.", r"[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{43}", 69),
    _prefixed("twilio-api-key", "Twilio API key SID", "SK", r"[0-9a-fA-F]{32}", 34, r"(?![A-Za-z0-9])"),
    _assigned(
        "twilio-auth-token",
        "Twilio auth token (next to its name)",
        r"twilio[A-Za-z0-9_]{0,20}(?:auth)?_?token",
        r"[a-f0-9]{32}" + r"(?![A-Za-z0-9])",
        ("token",),
        100,
    ),
    _prefixed(
        "databricks-token", "Databricks personal access token", "dapi", r"[a-f0-9]{32}(?:-\d)?", 38, r"(?![A-Za-z0-9])"
    ),
    _rule(
        "digitalocean-token",
        "DigitalOcean token",
        _START + r"do[opr]_v1_[a-f0-9]{64}" + _END,
        ("_v1_",),
        72,
        back=3,
    ),
    _rule(
        "vault-token",
        "HashiCorp Vault token",
        _START + r"hv[sbr]\.[A-Za-z0-9_-]{24,200}" + _END,
        ("hvs.", "hvb.", "hvr."),
        205,
    ),
    _rule(
        "shopify-token",
        "Shopify access token",
        _START + r"shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}" + _END,
        ("shpat_", "shpca_", "shppa_", "shpss_"),
        38,
    ),
    _prefixed("linear-api-key", "Linear API key", "lin_api_", r"[A-Za-z0-9]{40}", 48),
    _prefixed("docker-hub-pat", "Docker Hub personal access token", "dckr_pat_", r"[A-Za-z0-9_-]{27}", 36),
    _prefixed("pulumi-access-token", "Pulumi access token", "pul-", r"[a-f0-9]{40}", 44),
    _rule(
        "azure-storage-connection-string",
        "Azure Storage account key in a connection string",
        r"(?i:DefaultEndpointsProtocol=https?;AccountName=[a-z0-9]{3,24};)(?i:AccountKey=)(?P<secret>[A-Za-z0-9+/]{86}==)",
        ("accountkey=",),
        260,
        back=120,
        ignore_case=True,
    ),
    # A JWT: base64url of a JSON header and payload (both start `{"`, so `eyJ`), and a signature.
    _rule(
        "jwt",
        "JSON Web Token",
        _START + r"eyJ[A-Za-z0-9_-]{10,4096}\.eyJ[A-Za-z0-9_-]{10,8192}\.[A-Za-z0-9_-]{16,2048}" + _END,
        ("eyJ",),
        14400,
    ),
    # PEM private keys of every kind (RSA, EC, DSA, OPENSSH, ENCRYPTED, PKCS#8), also with their
    # newlines written as `\n` escapes (a key pasted into a JSON string inside a JSON string).
    _rule(
        "private-key-pem",
        "PEM private key block",
        r"-----BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----[A-Za-z0-9+/=\s\\:,-]{40,20000}?"
        r"-----END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?-----",
        ("-----begin ",),
        20200,
        ignore_case=True,
    ),
    # Credentials in a URL's user-info: scheme://user:password@host (only the password is redacted).
    _rule(
        "password-in-url",
        "Password in a URL (scheme://user:password@host)",
        r"\b[a-z][a-z0-9+.-]{1,20}://[^\s:/?#@\"'<>\[\]\\]{1,128}:(?P<secret>[^\s/?#@\"'<>\[\]\\]{3,256})@"
        r"[A-Za-z0-9.-]+",
        ("://",),
        660,
        back=22,
        ignore_case=True,
        loose=True,
    ),
    _rule(
        "bearer-token",
        "Bearer token in text (an Authorization header quoted in a log or prompt)",
        r"\bbearer\s{1,4}(?P<secret>[A-Za-z0-9._~+/-]{20,4096}=*)" + _END_B64,
        ("bearer",),
        4120,
        ignore_case=True,
        entropy_floor=3.0,
        loose=True,
    ),
    # Last: anything else assigned to a name that says it is a secret, when it looks random enough.
    _rule(
        "generic-secret-assignment",
        "Value assigned to a secret-looking name (password=, api_key:, ...), above an entropy floor",
        rf"(?P<key>[A-Za-z0-9_.-]{{0,40}}(?:{_SECRET_WORDS}))[\"']?\s{{0,3}}(?:[:=]|=>)\s{{0,3}}[\"'`]?"
        rf"(?P<secret>{_ASSIGNMENT_VALUE})",
        ("pass", "secret", "secrets", "key", "token", "credential", "credentials"),
        330,
        back=52,
        ignore_case=True,
        entropy_floor=3.0,
        generic=True,
        key_regex=rf"[A-Za-z0-9_.-]{{0,40}}(?:{_SECRET_WORDS})",
        value_regex=_ASSIGNMENT_VALUE,
    ),
)


def rule_pack_digest(rules: tuple[Rule, ...] = RULES) -> str:
    """Return `sha256:<hex>` over every rule's id, pattern and flags, in pack order.

    A proof names it so a reader can tell exactly which patterns scanned the files (ids alone
    would let a changed pattern pass as the same pack).
    """
    digest = hashlib.sha256()
    for rule in rules:
        for part in (rule.id, rule.pattern.pattern, str(rule.pattern.flags), repr(rule.entropy_floor)):
            digest.update(part.encode("utf-8"))
            digest.update(b"\x00")
        digest.update(b"\n")
    return "sha256:" + digest.hexdigest()
