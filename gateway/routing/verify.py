"""Checks on a cheap model's answer that say whether to escalate to a stronger one (the
verifier cascade's built-in checks, pure): each takes the answer's text (and what the request
asked for) and returns None when it passes, else the reason it fails.

  json        the answer parses as JSON (a request with a JSON response format)
  schema      ... and has the schema's required top-level keys and types (a small subset of JSON
              Schema: type, required, properties' types)
  tool_calls  every tool call names a tool of the request and its arguments parse as a JSON object
  math        a worked arithmetic answer is consistent: it ends with a final answer
              (``#### x``, ``answer is x``, ``\\boxed{x}``), every ``<<expr=value>>`` annotation
              evaluates to its value, and the final answer is the last result computed
  refusal     the answer is not a refusal ("I can't help with that", ...)

A graded alternative to ``math`` (a suspicion score that escalates a configured share of
answers) is in gateway/routing/verify_score.py.
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

_FINAL: Final = (
    re.compile(r"####\s*\$?\s*(-?[\d,]*\.?\d+)"),
    re.compile(r"answer is[:\s]*\$?\s*(-?[\d,]*\.?\d+)", re.IGNORECASE),
    re.compile(r"\\boxed\{\s*\$?(-?[\d,]*\.?\d+)"),
)
_NUMBER: Final = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?")
_ANNOTATION: Final = re.compile(r"<<([^<>=]+)=([^<>]+)>>")
_EQUATION: Final = re.compile(r"=\s*\$?\s*(-?[\d,]*\.?\d+)")
_REFUSAL: Final = re.compile(
    r"\b(I (?:can(?:no|')t|am unable to|won't|will not) (?:help|assist|provide|do|comply)|"
    r"I'm (?:sorry|afraid),? (?:but )?I (?:can(?:no|')t|am unable)|"
    r"as an AI(?: language model)?,? I (?:can(?:no|')t|don't))",
    re.IGNORECASE,
)
_OPS: Final[dict[type, Callable[[Any, Any], Any]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.FloorDiv: operator.floordiv,
}


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", "").strip().rstrip("."))
    except ValueError:
        return None


def _eval(expr: str) -> float | None:
    """A plain arithmetic expression's value (numbers, + - * / ** % //, parentheses), else None."""
    try:
        node = ast.parse(expr.replace("\\", "").replace(",", "").replace("x", "*"), mode="eval").body
    except SyntaxError:
        return None

    def walk(n: ast.AST) -> float:
        if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)):
            return float(n.value)
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
            return -walk(n.operand)
        if isinstance(n, ast.BinOp) and type(n.op) in _OPS:
            left, right = walk(n.left), walk(n.right)
            if isinstance(n.op, ast.Pow) and abs(right) > 64:
                raise ValueError("exponent too large")
            return float(_OPS[type(n.op)](left, right))
        raise ValueError("not arithmetic")

    try:
        return walk(node)
    except (ValueError, ZeroDivisionError, OverflowError):
        return None


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b)) or abs(a - b) < 0.01


def final_answer(text: str) -> float | None:
    for pattern in _FINAL:
        found = pattern.findall(text)
        if found:
            return _number(found[-1])
    return None


def math(text: str, question: str = "") -> str | None:
    """None when the worked answer is consistent, else why not (``question``: a question whose
    numbers are all whole expects a whole answer)."""
    final = final_answer(text)
    if final is None:
        return "no final answer"
    given = [_number(x) for x in _NUMBER.findall(question)]
    if given and all(g is not None and g == int(g) for g in given) and final != int(final):
        return f"the final answer {final:g} is not a whole number (the question's numbers all are)"
    last: float | None = None
    for expr, value in _ANNOTATION.findall(text):
        got, said = _eval(expr), _number(value)
        if said is None:
            said = _eval(value)
        if got is not None and said is not None and not _close(got, said):
            return f"the calculation {expr.strip()} = {value.strip()} is wrong"
        last = said if said is not None else last
    if last is None:
        found = _EQUATION.findall(text[: text.rfind("####")] if "####" in text else text)
        last = _number(found[-1]) if found else None
    if last is not None and not _close(last, final):
        return f"the final answer {final:g} is not the last result computed ({last:g})"
    return None


def refusal(text: str) -> str | None:
    return "the answer is a refusal" if _REFUSAL.search(text[:400]) else None


def json_text(text: str) -> str | None:
    try:
        json.loads(_unfenced(text))
    except ValueError:
        return "the answer is not valid JSON"
    return None


def schema(text: str, spec: Mapping[str, Any] | None) -> str | None:
    try:
        value = json.loads(_unfenced(text))
    except ValueError:
        return "the answer is not valid JSON"
    if not spec:
        return None
    types: dict[str, type | tuple[type, ...]] = {
        "object": dict,
        "array": list,
        "string": str,
        "number": (int, float),
        "integer": int,
        "boolean": bool,
    }
    want = spec.get("type")
    if isinstance(want, str) and want in types and not isinstance(value, types[want]):
        return f"the answer is not a JSON {want}"
    if isinstance(value, dict):
        for key in spec.get("required") or ():
            if key not in value:
                return f"the answer lacks the required key {key!r}"
        for key, sub in (spec.get("properties") or {}).items():
            t = sub.get("type") if isinstance(sub, dict) else None
            if key in value and isinstance(t, str) and t in types and not isinstance(value[key], types[t]):
                return f"the answer's {key!r} is not a {t}"
    return None


def tool_calls(calls: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]) -> str | None:
    names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, Mapping)}
    for call in calls:
        fn = call.get("function") or {}
        if fn.get("name") not in names:
            return f"the tool call names an unknown tool {fn.get('name')!r}"
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except ValueError:
            return f"the arguments of {fn.get('name')!r} are not valid JSON"
        if not isinstance(args, dict):
            return f"the arguments of {fn.get('name')!r} are not a JSON object"
    return None


@functools.cache
def plugin(spec: str) -> Callable[[Mapping[str, Any], Mapping[str, Any]], str | None]:
    """A plug-in check ``module:function``: (completion, request) -> the reason to escalate, or
    None. Imported once."""
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"cascade check {spec!r}: {name!r} is not a function of {module!r}")
    return fn  # type: ignore[no-any-return]


def question_of(request: Mapping[str, Any]) -> str:
    """The last user message's text."""
    for m in reversed(request.get("messages") or []):
        if isinstance(m, Mapping) and m.get("role") == "user":
            content = m.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                return " ".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def _unfenced(text: str) -> str:
    t = text.strip()
    if t.startswith("```"):
        t = t.split("\n", 1)[1] if "\n" in t else ""
        t = t.rsplit("```", 1)[0]
    return t


def _message(completion: Mapping[str, Any]) -> Mapping[str, Any]:
    message = ((completion.get("choices") or [{}])[0] or {}).get("message")
    return message if isinstance(message, Mapping) else {}


def answer_text(completion: Mapping[str, Any]) -> str:
    """A chat completion's answer: its first choice's message text ("" when there is none)."""
    content = _message(completion).get("content")
    return content if isinstance(content, str) else ""


def check(names: Sequence[str], completion: Mapping[str, Any], request: Mapping[str, Any]) -> str | None:
    """Run the named checks on a chat completion for ``request`` (an OpenAI chat body): the
    first failure's reason, or None when all pass (what the cascade escalates on)."""
    message, text = _message(completion), answer_text(completion)
    fmt = request.get("response_format") or {}
    for name in names:
        if name == "math":
            why = math(text, question_of(request))
        elif name == "refusal":
            why = refusal(text)
        elif name == "json":
            why = json_text(text) if fmt.get("type") in ("json_object", "json_schema") else None
        elif name == "schema":
            spec = (fmt.get("json_schema") or {}).get("schema") if fmt.get("type") == "json_schema" else None
            why = schema(text, spec) if fmt.get("type") == "json_schema" else None
        elif name == "tool_calls":
            calls = message.get("tool_calls") or []
            why = tool_calls(calls, request.get("tools") or []) if calls else None
        else:
            raise ValueError(f"unknown check {name!r}; use {', '.join(CHECKS)}")
        if why is not None:
            return f"{name}: {why}"
    return None


CHECKS: Final = ("json", "schema", "tool_calls", "math", "refusal")
