"""Resolve what a client asked for (a route or a catalog model) into an ordered plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from fnmatch import fnmatchcase

from gateway.config.policy import Policy, RoutePolicy
from gateway.core.errors import BadRequestError, NotConfiguredError, NotFoundError, PermissionDeniedError
from gateway.core.types import Price, Principal, Target
from gateway.routing.plan import RoutePlan
from gateway.routing.tiers import build_auto

_NAME_SHOWN = 200  # characters of an unknown model name a 404 echoes
_SHOWN = 24  # names a 404 lists
_ENV_HINT = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}


class Router:
    def __init__(self, policy: Policy) -> None:
        self._policy = policy
        self._targets = {name: self._target(name) for name in policy.models}
        self._plans: dict[str, RoutePlan] = {}
        for name, route in policy.routes.items():
            self._plans[name] = self._plan(
                name, [t.model for t in route.targets], route, route.baseline, True
            )
            if route.classifier is not None:
                auto = build_auto(name, route, self._route_planner(name, route), policy.models)
                self._plans[name] = replace(self._plans[name], auto=auto)
        if policy.allow_direct_models:
            for name in policy.models:
                direct = RoutePolicy.model_validate({"targets": [name]})
                self._plans[name] = self._plan(name, [name], direct, None, False)

    def _target(self, name: str) -> Target:
        m = self._policy.models[name]
        p = m.price
        if p is None:  # the loader fills prices in (config.catalog.resolve_prices)
            raise ValueError(f"model '{name}' has no price: load the policy with gateway.config.loader")
        return Target(
            model=name,
            provider=m.provider,
            upstream_model=m.upstream or name,
            price=Price(
                input=p.input,
                output=p.output,
                cached_input=p.cached_input,
                cache_write=p.cache_write,
                cache_write_1h=p.cache_write_1h,
                batch=p.batch,
            ),
            context_window=m.context_window,
            self_hosted=self._policy.providers[m.provider].self_hosted,
        )

    def _route_planner(self, name: str, route: RoutePolicy) -> Callable[[list[str]], RoutePlan]:
        return lambda models: self._plan(name, models, route, route.baseline, True)

    def _plan(
        self, name: str, models: list[str], route: RoutePolicy, baseline: str | None, is_route: bool
    ) -> RoutePlan:
        configured: list[Target] = []
        skipped: list[str] = []
        for model in models:
            provider = self._policy.providers[self._policy.models[model].provider]
            if provider.configured:
                configured.append(self._targets[model])
            else:
                skipped.append(self._policy.models[model].provider)
        return RoutePlan(
            name=name,
            kind=self._policy.models[models[0]].kind,
            targets=tuple(configured),
            unconfigured=tuple(dict.fromkeys(skipped)),
            baseline=self._targets[baseline or models[0]],
            policy=route,
            is_route=is_route,
        )

    def plan(self, model: object, principal: Principal, kind: str) -> RoutePlan:
        """``resolve``, then ``require_targets``."""
        plan = self.resolve(model, principal, kind)
        self.require_targets(plan)
        return plan

    def resolve(self, model: object, principal: Principal, kind: str) -> RoutePlan:
        """The plan of ``model`` (a route, catalog model or alias) for this principal and kind,
        its targets possibly none (no configured provider: ``require_targets`` says so)."""
        if not isinstance(model, str) or not model:
            raise BadRequestError("'model' must be a non-empty string", param="model")
        plan = self._plans.get(model)
        if plan is None:
            model = self._alias(model)
            plan = self._plans.get(model)
        if plan is None:
            raise NotFoundError(self._not_served(model, principal, kind), param="model")
        allowed = principal.allowed_models
        if allowed is not None and "*" not in allowed and model not in allowed:
            raise PermissionDeniedError(f"This key may not use the model '{model}'", param="model")
        if plan.kind != kind:
            raise BadRequestError(f"The model '{model}' serves {plan.kind}, not {kind}", param="model")
        return plan

    @staticmethod
    def require_targets(plan: RoutePlan) -> None:
        if not plan.targets:
            hints = ", ".join(_ENV_HINT.get(p, p) for p in plan.unconfigured)
            raise NotConfiguredError(
                f"No configured provider can serve '{plan.name}': its providers have no API key ({hints})"
            )

    def kind_of(self, model: object) -> str | None:
        """The kind (chat | completions | embeddings) a model, route or alias serves; None when
        the name is unknown (``plan`` then says why)."""
        if not isinstance(model, str):
            return None
        plan = self._plans.get(model) or self._plans.get(self._alias(model))
        return plan.kind if plan is not None else None

    def _alias(self, model: str) -> str:
        """The route/model an alias pattern maps ``model`` to (``model`` itself when none does)."""
        for pattern, name in self._policy.aliases.items():
            if fnmatchcase(model, pattern):
                return name
        return model

    def _not_served(self, model: str, principal: Principal, kind: str) -> str:
        """A 404's message: what this key may call for ``kind`` (routes first) and the policy
        line that would serve ``model``."""
        names = [n for n, _ in self.visible_models(principal) if self._plans[n].kind == kind]
        names.sort(key=lambda n: not self._plans[n].is_route)
        more = f" (and {len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
        shown = ", ".join(names[:_SHOWN]) + more
        name = model if len(model) <= _NAME_SHOWN else model[:_NAME_SHOWN] + "..."
        msg = f"The model '{name}' is not served by this gateway. Served {kind} models: {shown or 'none'}."
        if names and name is model:
            msg += f' To serve it, add to the policy\'s aliases: "{model}": {names[0]}'
        return msg

    def visible_models(self, principal: Principal) -> list[tuple[str, str]]:
        """(id, owner) of every route/model this principal may call."""
        allowed = principal.allowed_models
        out = []
        for name, plan in self._plans.items():
            if allowed is None or "*" in allowed or name in allowed:
                owner = "switchyard" if plan.is_route else self._policy.models[name].provider
                out.append((name, owner))
        return out
