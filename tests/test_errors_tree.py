"""One error tree: every exception class the gateway defines is a ``SwitchyardError`` and so
knows its HTTP status, OpenAI error type, code and retryability."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import gateway
from gateway.config.loader import PolicyError
from gateway.core.errors import ServiceUnavailableError, SwitchyardError, UpstreamError
from gateway.ledger.db import LedgerUnavailable
from gateway.protocols.anthropic_outbound import MalformedResponseError
from gateway.routing.classifier import ClassifierError


def _exception_classes() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for info in pkgutil.walk_packages(gateway.__path__, "gateway."):
        if info.name.rpartition(".")[2] == "__main__":  # runs the CLI on import
            continue
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__ and issubclass(cls, BaseException):
                found.append(cls)
    return found


def test_every_exception_class_of_the_gateway_is_a_switchyard_error() -> None:
    classes = _exception_classes()
    names = {f"{c.__module__}.{c.__qualname__}" for c in classes}
    assert {  # the walk does find the ones defined outside core.errors
        "gateway.config.loader.PolicyError",
        "gateway.ledger.db.LedgerUnavailable",
        "gateway.protocols.anthropic_outbound.MalformedResponseError",
        "gateway.routing.classifier.ClassifierError",
    } <= names
    outside = sorted(
        f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, SwitchyardError)
    )
    assert outside == []
    for cls in classes:
        assert isinstance(cls.status, int) and 400 <= cls.status <= 599, cls
        assert isinstance(cls.type, str) and cls.type, cls
        assert isinstance(cls.retryable, bool), cls


def test_policy_error_body_is_the_reload_answer() -> None:
    err = PolicyError("policy.yaml", [("routes.auto.targets[1].model", "unknown model 'x'"), ("", "worse")])
    assert err.status == 422 and not err.retryable
    assert err.problems == [("routes.auto.targets[1].model", "unknown model 'x'"), ("", "worse")]
    assert (
        str(err)
        == err.render()
        == "policy.yaml: 2 problem(s)\n  routes.auto.targets[1].model: unknown model 'x'\n  worse"
    )
    assert err.to_body() == {
        "error": {
            "message": "The policy file has errors; the running policy was kept",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_policy",
            "problems": [
                {"path": "routes.auto.targets[1].model", "message": "unknown model 'x'"},
                {"path": "", "message": "worse"},
            ],
        }
    }


@pytest.mark.parametrize(
    ("err", "base", "status", "code"),
    [
        (
            LedgerUnavailable("cannot connect to the PostgreSQL ledger: refused"),
            ServiceUnavailableError,
            503,
            "ledger_unavailable",
        ),
        (
            MalformedResponseError("not an Anthropic message object"),
            UpstreamError,
            502,
            "upstream_bad_response",
        ),
        (ClassifierError("w.json: not a weights file"), SwitchyardError, 500, "invalid_classifier"),
    ],
)
def test_moved_errors_know_status_and_code(err: SwitchyardError, base: type, status: int, code: str) -> None:
    assert isinstance(err, base)
    assert err.status == status and err.code == code
    body = err.to_body()["error"]
    assert isinstance(body, dict) and body["code"] == code and body["message"] == str(err)


def test_classifier_error_is_still_a_value_error() -> None:
    with pytest.raises(ValueError, match="weights"):
        raise ClassifierError("bad weights")
