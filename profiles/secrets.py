"""The secret scanner behind the profile guard: :func:`find_secret` says where a profile's data
holds a password, a private key or a token, whatever key it hides under.

Called by :func:`profiles.schema.check_secrets` (every save, load, import and list) and by tests.
Three nets: names (a key, flag or environment variable that says it holds a secret), value
shapes (a token format, key material, a password in a URL or in prose, whatever the name) and
shell text (flags, assignments and pipes inside ``launch.remote_setup``). A value that is a path
or a reference (``$VAR``) is never a secret: a profile names key files, it just never holds what
is in them.

Linear time, whatever the text: every pattern searched over a whole text starts with a literal
or at the start of a run of the characters it then repeats (a look-behind refuses a start inside
such a run), and its repeats are possessive, so no start position is tried twice over the same
run (the patterns this replaced took 20 s on 128 KB of letters). Shell text is split by one
regular expression, not :mod:`shlex` (which is quadratic in a word's length).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

# --------------------------------------------------------------------------- names

# Whole words of a name (split on '_', '-', '.', spaces and camelCase) that say "secret".
_SECRET_WORDS = frozenset(
    {
        "password",
        "passwd",
        "passphrase",
        "passcode",
        "pass",
        "pwd",
        "pw",
        "pat",
        "token",
        "secret",
        "secrets",
        "apikey",
        "credential",
        "credentials",
        "privatekey",
        "accesstoken",
        "authtoken",
        "accesskey",
        "secretkey",
    }
)
# Inside a word too: PGPASSWORD, MYSQLPASSWD, NGROK_AUTHTOKEN, AZURECLIENTSECRET.
_SECRET_PARTS = ("password", "passwd", "passphrase", "secret", "apikey", "authtoken", "accesstoken")
_SECRET_PAIRS = frozenset(
    {("api", "key"), ("private", "key"), ("access", "key"), ("auth", "key"), ("secret", "key")}
)
# A name that says it holds where the secret is, or how much of something, is fine:
# SSH_KEY_PATH, GOOGLE_..._FILE, --password-stdin, --secret-name, --token-budget, --max-tokens,
# git's credential.helper (a program's name).
_PATH_SUFFIXES = (
    "path",
    "file",
    "dir",
    "filename",
    "stdin",
    "name",
    "id",
    "arn",
    "url",
    "env",
    "helper",
)
_QUANTITY_WORDS = frozenset(
    {
        "budget",
        "count",
        "limit",
        "len",
        "length",
        "size",
        "num",
        "max",
        "min",
        "rate",
        "per",
        "ids",
        "type",
        "through",
        "level",
        "parallelism",
    }
)
# Every name is_secret_name can accept holds one of these (a cheap test before splitting it).
_NAME_HINTS = ("pass", "pw", "pat", "token", "secret", "key", "cred")


def _words(name: str) -> list[str]:
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)  # accessToken -> access_Token
    return [w for w in re.split(r"[_\-.\s]+", name.lower()) if w]


def is_secret_name(name: str, *, env: bool = False) -> bool:
    """True when a key, flag or environment variable name says it holds a secret.
    For environment names, a bare ``KEY`` word counts too (``WANDB_API_KEY``, ``SSH_KEY``) unless
    the name says it is a path (``SSH_KEY_PATH``) or a quantity (``--token-budget``)."""
    low = name.lower()
    if not any(h in low for h in _NAME_HINTS):
        return False
    words = _words(name.lstrip("-"))
    if not words:
        return False
    if words[-1] in _PATH_SUFFIXES or any(w in _QUANTITY_WORDS for w in words):
        return False
    if any(w in _SECRET_WORDS for w in words):
        return True
    if any(part in w for w in words for part in _SECRET_PARTS):
        return True
    if any(pair in _SECRET_PAIRS for pair in zip(words, words[1:], strict=False)):
        return True
    return env and words[-1] == "key"  # SSH_KEY, WANDB_API_KEY; not StrictHostKeyChecking


# --------------------------------------------------------------------------- values

# A flag ending in "key" (--wandb-key, --license-key) holds a secret when its value looks like
# one: long and made of token characters (--sort-key loss does not).
_CREDENTIAL_SHAPE = re.compile(r"[A-Za-z0-9_\-+/=.~]{16,}+")
_PATH_SHAPE = re.compile(
    r"(?:~|\.{1,2}/|/)\S*+"  # /abs, ~/x, ./x, ../x
    r"|[\w.\-/]*/[\w.\-]+\.(?:json|pem|key|crt|p12|pfx|gpg|asc|txt|env|toml|ya?ml|ini|cfg)"
)
# ``$(echo pw)``, ``$(printf pw)``, a back-quoted echo, ``${X:-pw}``: a literal dressed up as a
# reference (the shell hands over the text that is right there).
_LITERAL_SUBST = re.compile(
    r"\$\(\s*+(?:echo|printf)\b|`\s*+(?:echo|printf)\b"
    r"|\$\{[A-Za-z_][A-Za-z0-9_]*+:?[-=]['\"]?[^}\s$'\"]"
)


def _is_reference(value: str) -> bool:
    """``$HF_TOKEN``, ``${X}`` or ``$(cat file)``: the value is looked up on the node. Not
    ``$(echo pw)`` or ``${X:-pw}``, which hold the literal."""
    return value.startswith("$") and _LITERAL_SUBST.match(value) is None


def _is_path(value: str) -> bool:
    """``/abs``, ``~/x``, ``./x`` or ``dir/name.json``: where a secret lives, not the secret."""
    return _PATH_SHAPE.fullmatch(value) is not None


def _b64_cores(marker: bytes) -> tuple[str, ...]:
    """The base64 text that ``marker`` encodes to at each of the three byte alignments, less
    the characters its neighbours change (both alphabets: standard and URL-safe)."""
    cores: list[str] = []
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + marker + b"\0" * 3).decode()
        core = enc[(k * 8 + 5) // 6 : ((k + len(marker)) * 8) // 6]
        cores += [core, core.replace("+", "-").replace("/", "_")]
    return tuple(dict.fromkeys(cores))


# Key material base64-encoded once more (a whole PEM file through ``base64``).
_B64_KEY_MARKERS = _b64_cores(b"PRIVATE KEY") + _b64_cores(b"openssh-key-v1")

# Starts: ``(?<![...])`` refuses a start inside a run of what the pattern repeats next, so each
# run is tried once (linear); ``++``/``{n,}+`` never give back what they took. Each shape lists
# the literals one of which it cannot match without (``in`` finds those in a megabyte in well
# under a millisecond, so a text holding none is never searched); ``folded``: the literals are
# lower case and looked for in the lower-cased text.
_B = r"(?<![A-Za-z0-9_-])"


class _Shape(NamedTuple):
    pattern: re.Pattern[str]
    what: str
    needles: tuple[str, ...]
    folded: bool = False


def _shape(regex: str, what: str, *needles: str, folded: bool = False) -> _Shape:
    return _Shape(re.compile(regex), what, needles, folded)


_VALUE_PATTERNS: tuple[_Shape, ...] = (
    _shape(r"-----BEGIN [A-Z0-9 ]{0,40}PRIVATE KEY", "private key material", "-----BEGIN "),
    _shape(r"PuTTY-User-Key-File", "private key material", "PuTTY-User-Key-File"),
    _shape(r"AGE-SECRET-KEY-1", "an age secret key", "AGE-SECRET-KEY-1"),
    # The body of a key without its header: openssh-key-v1, or DER (PKCS#1/#8) in base64.
    _shape(r"b3BlbnNzaC1rZXktdjE", "private key material", "b3BlbnNzaC1rZXktdjE"),
    _shape(r"(?<![A-Za-z0-9+/])MII[A-Za-z0-9+/]{40}", "private key material", "MII"),
    _shape(_B + r"hf_[A-Za-z0-9]{30}", "a Hugging Face token", "hf_"),
    _shape(
        _B + r"(?:gh[pousr]_[A-Za-z0-9]{30}|github_pat_[A-Za-z0-9_]{30})",
        "a GitHub token",
        *(f"gh{c}_" for c in "pousr"),
        "github_pat_",
    ),
    _shape(_B + r"glpat-[A-Za-z0-9_-]{20}", "a GitLab token", "glpat-"),
    _shape(_B + r"AIza[0-9A-Za-z_-]{30}", "a Google API key", "AIza"),
    _shape(_B + r"eyJ[A-Za-z0-9_-]{8,}+\.eyJ[A-Za-z0-9_-]{8}", "a JWT", ".eyJ"),
    _shape(_B + r"sk-[A-Za-z0-9_-]{20}", "an API key", "sk-"),
    _shape(
        _B + r"(?:[sr]k_(?:live|test)_[A-Za-z0-9]{16}|whsec_[A-Za-z0-9]{24})",
        "a Stripe key",
        "k_live_",
        "k_test_",
        "whsec_",
    ),
    _shape(_B + r"npm_[A-Za-z0-9]{36}(?![A-Za-z0-9])", "an npm token", "npm_"),
    _shape(_B + r"pypi-AgE[A-Za-z0-9_-]{40}", "a PyPI token", "pypi-AgE"),
    _shape(
        r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Za-z0-9])",
        "an AWS access key",
        "AKIA",
        "ASIA",
    ),
    _shape(_B + r"(?:xox[abeprs]|xapp)-[A-Za-z0-9-]{10}", "a Slack token", "xox", "xapp-"),
    _shape(r"hooks\.slack\.com/services/[A-Za-z0-9]", "a Slack webhook", "hooks.slack.com/"),
    _shape(_B + r"hv[sbr]\.[A-Za-z0-9_-]{24}", "a Vault token", "hvs.", "hvb.", "hvr."),
    _shape(
        _B + r"do[por]_v1_[0-9a-f]{32}",
        "a DigitalOcean token",
        "dop_v1_",
        "doo_v1_",
        "dor_v1_",
    ),
    _shape(_B + r"dapi[0-9a-f]{32}(?![A-Za-z0-9])", "a Databricks token", "dapi"),
    _shape(_B + r"SG\.[A-Za-z0-9_-]{16,}+\.[A-Za-z0-9_-]{16}", "a SendGrid key", "SG."),
    # scheme://user:password@host, any scheme (redis://:pw@h has no user).
    _shape(
        r"(?<![A-Za-z0-9+.-])[A-Za-z][A-Za-z0-9+.-]*+://[^/\s:@]*+:[^/\s@]++@",
        "a password inside a URL",
        "://",
    ),
    _shape(
        r"(?i)\bauthorization:\s*+(?:bearer|basic|token)\s++[A-Za-z0-9._~+/=-]{8}",
        "an Authorization header",
        "authorization:",
        folded=True,
    ),
    _shape(r"(?i)\bbearer\s++[A-Za-z0-9._~+/-]{16}", "a bearer token", "bearer", folded=True),
    _shape(
        r"(?i)\bmachine\s++\S++\s++login\s++\S++\s++password\s++\S",
        "a .netrc password",
        "machine",
        folded=True,
    ),
    # openssl's -passin pass:PW / -passout pass:PW.
    _shape(
        r"(?i)-pass(?:in|out)?\s++['\"]?pass:[^\s'\"]",
        "a password given as pass:",
        "pass:",
        folded=True,
    ),
)
# ``s.`` + 24 characters: a Vault token before 1.10; mixed case and a digit tell it from a word.
_VAULT_LEGACY = re.compile(r"(?<![A-Za-z0-9_.-])[sb]\.([A-Za-z0-9]{24})(?![A-Za-z0-9_-])")
# ``user:password@host`` without a scheme (an SSH host, a git remote); a digest such as
# ``image:tag@sha256:...`` is not one (what follows the host is not a port or a path).
_USERINFO = re.compile(
    r"(?<![A-Za-z0-9_.:/@-])[A-Za-z0-9_.-]++:[^\s/@:]++@[A-Za-z0-9-]++(?:\.[A-Za-z0-9-]++)*+"
    r"(?::[0-9]++)?+(?![A-Za-z0-9_:@-]|\.[A-Za-z0-9])"
)

# ``export HF_TOKEN=abc``, ``WANDB_API_KEY=...`` or ``?access_token=...`` inside text. The value
# is looked at, not taken (``--from-literal=password=pw`` chains); it stops at '=' so chained
# looks never cover the same characters twice.
_ASSIGN_RE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*+)\s*+=\s*+(?=['\"]?+([^\s'\"&;|=]*+))")

# A secret word said in prose, JSON, YAML or a header: ``password: hunter2``, ``"api_key":
# "..."``, ``X-API-Key: ...``, ``my password is hunter2``, ``wandb key 0123...``.
_PROSE_NAME = re.compile(
    r"(?i)(?<![A-Za-z0-9])(pass(?:word|wd|phrase|code)|pwd?|secret(?:[ _-]?key)?|token"
    r"|api[ _-]?key|access[ _-]?(?:key|token)|private[ _-]?(?:key|token)|auth[ _-]?token|key)"
    r"(?![A-Za-z0-9])"
)
_PROSE_COLON = re.compile(r"['\"]?+\s*+[:=]\s*+['\"]?+([^\s'\",;)}\]]++)")
_PROSE_IS = re.compile(r"(?i)\s++(?:is|was)\s++['\"]?+([^\s'\",;)}\]]++)")
_PROSE_NEXT = re.compile(r"\s++['\"]?+([A-Za-z0-9_\-+/=.~]{16,}+)")
_PASSWORD_WORDS = frozenset({"pass", "password", "passwd", "passphrase", "passcode", "pw", "pwd"})
# What follows "password:" in a sentence that holds none.
_PROSE_STOP = frozenset(
    {
        "a",
        "an",
        "the",
        "none",
        "null",
        "nil",
        "empty",
        "unset",
        "n/a",
        "na",
        "no",
        "not",
        "never",
        "on",
        "in",
        "at",
        "from",
        "via",
        "see",
        "set",
        "stored",
        "kept",
        "read",
        "loaded",
        "taken",
        "given",
        "managed",
        "required",
        "optional",
        "needed",
        "true",
        "false",
        "yes",
        "redacted",
        "hidden",
        "elsewhere",
        "per",
        "by",
        "of",
        "is",
        "and",
        "or",
        "-",
        "*",
    }
)


def _prose_value_ok(name: str, value: str, *, strict: bool) -> bool:
    """Whether ``value`` said after ``name`` (in prose or a header) is harmless. ``strict``: the
    words between were "is"/"was", so only something shaped like a password counts."""
    v = value.strip("`.!?")
    if not v or v.lower() in _PROSE_STOP or _is_reference(v) or _is_path(v):
        return True
    if v.startswith("<") or set(v) <= {"*", "x", "X", "."}:  # <your token>, ***, xxx
        return True
    if name.lower() not in _PASSWORD_WORDS and not re.search(r"[A-Za-z]", v):
        return True  # "token: 4096", "key = 8"
    if strict:
        return not (re.search(r"[^A-Za-z]", v) or (v.lower() != v and v.upper() != v))
    return False


def _credential_like(v: str) -> bool:
    """Long token characters with a letter and a digit: what a generated key looks like."""
    return (
        _CREDENTIAL_SHAPE.fullmatch(v) is not None
        and not _is_path(v)
        and re.search(r"[0-9]", v) is not None
        and re.search(r"[A-Za-z]", v) is not None
    )


def _prose_secret(value: str) -> str | None:
    """A secret word followed by a value: ``password: hunter2``, ``my password is hunter2``,
    ``X-Api-Key: ...``, ``WANDB_API_KEY 0123...`` (a long, generated-looking value)."""
    for m in _PROSE_NAME.finditer(value):
        name = m.group(1)
        word = re.sub(r"[ _-]", "", name.lower())
        after = m.end()
        c = _PROSE_COLON.match(value, after)
        if c and word != "key" and not _prose_value_ok(word, c.group(1), strict=False):
            return f"a secret written out after {name!r}"
        i = _PROSE_IS.match(value, after)
        if i and word in _PASSWORD_WORDS and not _prose_value_ok(word, i.group(1), strict=True):
            return f"a secret written out after {name!r}"
        n = _PROSE_NEXT.match(value, after)
        if n and _credential_like(n.group(1)):
            return f"a secret written out after {name!r}"
        if c and word == "key" and _credential_like(c.group(1)):
            return f"a secret written out after {name!r}"
    return None


# --------------------------------------------------------------------------- flags and shell

# Commands whose ``-p`` is a password (``sshpass -p X``, ``mysql -pX``, ``docker login -p X``).
_P_IS_PASSWORD = frozenset({"sshpass", "mysql", "mysqldump", "mysqladmin", "docker", "podman"})
# What ``-p`` takes when it is a port or a port mapping: 8080, 8080:80, 127.0.0.1:80:80/udp.
_PORT_SHAPE = re.compile(r"[0-9.:\[\]]++(?:/(?:tcp|udp|sctp))?+")
# Other commands' password flags: ``redis-cli -a PW``.
_PASSWORD_FLAGS: dict[str, frozenset[str]] = {"redis-cli": frozenset({"-a"})}
# Commands that take a secret as their argument (``wandb login KEY``).
_LOGIN_COMMANDS = frozenset({"wandb"})
# Commands that set a named setting (``aws configure set aws_secret_access_key PW``,
# ``npm config set //registry/:_authToken T``, ``git config user.password PW``).
_CONFIG_COMMANDS = frozenset(
    {"aws", "npm", "yarn", "pnpm", "pip", "pip3", "git", "poetry", "conda", "gcloud", "az"}
)
_ECHO_COMMANDS = frozenset({"echo", "printf"})
# ``curl -u user:password``.
_CURL_USER = re.compile(r"['\"]?+[^\s:'\"]++:[^\s'\"$]")
# Shell text, one token at a time: a separator run, a word (unquoted runs, quoted strings and
# escapes glued together) or blanks. A text this cannot cover (an open quote) is split on blanks.
_SHELL_TOKEN = re.compile(
    r"""(?P<sep>[;&|()\n]++)"""
    r"""|(?P<word>(?:[^\s'"\\;&|()]++|'[^']*+'|"[^"\\]*+(?:\\.[^"\\]*+)*+"|\\.)++)"""
    r"""|[ \t\r\f\v]++""",
    re.S,
)
_UNQUOTE = re.compile(r"""'([^']*+)'|"((?:[^"\\]++|\\.)*+)"|\\(.)""", re.S)


def _unquote(word: str) -> str:
    if "'" not in word and '"' not in word and "\\" not in word:
        return word
    return _UNQUOTE.sub(
        lambda m: m.group(1) if m.group(1) is not None else (m.group(2) or m.group(3) or ""),
        word,
    )


def _shell_words(text: str) -> list[str]:
    """``text`` split as a shell would (quotes, ``;``, ``&&``, ``|``), separators kept as words
    of their own; a text no shell could parse is split on white space."""
    words: list[str] = []
    pos = 0
    for m in _SHELL_TOKEN.finditer(text):
        if m.start() != pos:
            return text.split()
        pos = m.end()
        if m.lastgroup == "sep":
            words.append(m.group())
        elif m.lastgroup == "word":
            words.append(_unquote(m.group()))
    if pos != len(text):
        return text.split()
    return words


def _is_separator(word: str) -> bool:
    return bool(word) and word[0] in ";&|()\n" and word.strip(";&|()\n") == ""


def _flag_holds_secret(flag: str, value: str, *, shell_command: str = "") -> bool:
    """Whether ``flag`` given ``value`` passes a secret. ``shell_command``: the command the flag
    belongs to, in shell text (decides what ``-p`` means)."""
    if not value or _is_reference(value) or _is_path(value):
        return False
    if is_secret_name(flag):
        return True
    if flag in _PASSWORD_FLAGS.get(shell_command, ()):
        return True
    words = _words(flag.lstrip("-"))
    if words and words[-1] == "key" and _CREDENTIAL_SHAPE.fullmatch(value):
        return True
    name, eq, rest = value.partition("=")  # --from-literal=password=PW, -e DB_PASSWORD=PW
    if eq and rest and is_secret_name(name, env=True) and not _is_reference(rest):
        return not _is_path(rest)
    if flag == "-p":  # mysql / sshpass / docker login style; a port (-p 8080, -p 80:8080) is not
        if _PORT_SHAPE.fullmatch(value):
            return False
        return shell_command in _P_IS_PASSWORD if shell_command else True
    return False


def _args_secret(args: list[str], *, shell: bool = False) -> tuple[int, str] | None:
    """The first (index, flag) in ``args`` that passes a secret."""
    command = ""
    echoed = False  # the pipeline so far echoes a literal (echo PW | docker login --password-stdin)
    for i, arg in enumerate(args):
        if shell and _is_separator(arg):
            if arg != "|":
                echoed = False
            command = ""
            continue
        if shell and not command and not _ASSIGN_RE.match(arg):
            command = arg.rsplit("/", 1)[-1]
            continue
        nxt = args[i + 1] if i + 1 < len(args) else ""
        if not arg.startswith("-") or arg == "-":
            if not shell:
                continue
            if command in _ECHO_COMMANDS and not _is_reference(arg):
                echoed = True
            if command in _LOGIN_COMMANDS and args[i - 1] == "login" and not _is_reference(arg):
                return i, f"{command} login"
            if (
                command in _CONFIG_COMMANDS
                and is_secret_name(arg, env=True)
                and nxt
                and not nxt.startswith("-")
                and not _is_separator(nxt)
                and not _is_reference(nxt)
                and not _is_path(nxt)
            ):
                return i, f"{command} setting {arg}"
            continue
        if shell and echoed and arg.endswith("-stdin") and is_secret_name(arg[: -len("-stdin")]):
            return i, f"echo into {arg}"
        if shell and command in _P_IS_PASSWORD and arg.startswith("-p") and len(arg) > 2:
            if not arg.startswith("--") and not _is_reference(arg[2:]):
                return i, "-p"  # mysql -pSECRET
        flag, eq, val = arg.partition("=")
        if not eq:
            skip = nxt.startswith("-") or (shell and _is_separator(nxt))
            val = "" if skip else nxt
        if shell and command == "curl" and flag in ("-u", "--user") and _CURL_USER.match(val):
            return i, "curl -u"
        if _flag_holds_secret(flag, val, shell_command=command if shell else ""):
            return i, flag
    return None


# --------------------------------------------------------------------------- the walk


def _walk(data: Any, path: str) -> Iterator[tuple[str, str | None, Any]]:
    """Yield (dotted path, key or None, value) for every leaf and key in ``data``."""
    if isinstance(data, Mapping):
        for k, v in data.items():
            sub = f"{path}.{k}" if path else str(k)
            yield sub, str(k), v
            yield from _walk(v, sub)
    elif isinstance(data, list | tuple):
        for i, v in enumerate(data):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, None, data


def _text_secret(value: str, *, shell: bool) -> str | None:
    """What secret ``value`` holds (a known shape, an assignment, prose, a flag in shell text)."""
    low = value.lower()
    for shape in _VALUE_PATTERNS:
        hay = low if shape.folded else value
        if any(n in hay for n in shape.needles) and shape.pattern.search(value):
            return shape.what
    if any(marker in value for marker in _B64_KEY_MARKERS):
        return "private key material (base64-encoded)"
    hinted = any(h in low for h in _NAME_HINTS)
    for m in _VAULT_LEGACY.finditer(value) if "s." in value or "b." in value else ():
        tok = m.group(1)
        if tok.lower() != tok and tok.upper() != tok and re.search(r"[0-9]", tok):
            return "a Vault token"
    if "@" in value and ":" in value and _USERINFO.search(value):
        return "a password in user:password@host"
    for m in _ASSIGN_RE.finditer(value) if hinted and "=" in value else ():
        assigned = m.group(2)
        if (
            assigned
            and is_secret_name(m.group(1), env=True)
            and not (_is_reference(assigned) or _is_path(assigned))
        ):
            return f"a secret assigned to {m.group(1)}"
    what = _prose_secret(value) if hinted else None
    if what:
        return what
    if shell:
        found = _args_secret(_shell_words(value), shell=True)
        if found:
            return f"a secret passed as {found[1]}"
    return None


def find_secret(data: Mapping[str, Any]) -> tuple[str, str] | None:
    """The first (dotted path, what) in ``data`` that looks like a secret, or None."""
    launch = data.get("launch")
    args = launch.get("script_args") if isinstance(launch, Mapping) else None
    if isinstance(args, list):
        found = _args_secret([str(a) for a in args])
        if found:
            return f"launch.script_args[{found[0]}]", f"a secret passed as {found[1]}"
    for path, key, value in _walk(data, ""):
        if key is not None:
            in_env = path.startswith("launch.env.")
            if in_env and is_secret_name(key, env=True):
                if (
                    isinstance(value, str)
                    and value
                    and not _is_reference(value)
                    and not _is_path(value)
                ):
                    return path, "a secret-named environment variable with a value"
            elif not in_env and is_secret_name(key):
                return path, "a secret-named key"
            continue
        if not isinstance(value, str):
            continue
        what = _text_secret(value, shell=path == "launch.remote_setup")
        if what:
            return path, what
    return None
