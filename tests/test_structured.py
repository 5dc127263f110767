"""Structured output in process (SmolLM2): ``StructuredOutputsParams`` with a JSON schema (dict, text or
pydantic model), a JSON object, a regex, a choice and a Lark grammar. Every reply satisfies its
constraint, checked by an outside validator (``jsonschema``, pydantic, ``re``); a constrained request is
bit-identical alone and in a batch; bad constraints raise ``InvalidRequest`` before anything runs."""

from __future__ import annotations

import json
import re

import jsonschema
import pydantic
import pytest

import lmplex
from lmplex import InvalidRequest, SamplingParams, StructuredOutputsParams

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "pattern": "^[a-z]{1,10}@[a-z]{1,10}\\.com$"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "email", "tags"],
    "additionalProperties": False,
}


class Recipe(pydantic.BaseModel):
    title: str = pydantic.Field(max_length=30)
    minutes: int = pydantic.Field(ge=1, le=240)
    vegetarian: bool
    steps: list[str] = pydantic.Field(min_length=1, max_length=3)


def _params(so: StructuredOutputsParams, temperature: float = 0.0, seed: int = 0) -> SamplingParams:
    return SamplingParams(temperature=temperature, seed=seed, max_tokens=160, structured_outputs=so)


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


@pytest.mark.parametrize("temperature", [0.0, 0.8, 1.2])
def test_json_schema_replies_validate(engine: lmplex.Engine, temperature: float) -> None:
    so = StructuredOutputsParams(json=PERSON)
    outs = engine.generate(
        [_ask(f"Invent person number {i} as JSON.") for i in range(4)], _params(so, temperature, seed=3)
    )
    for out in outs:
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), PERSON)


def test_pydantic_model_and_schema_text_are_the_same_constraint(engine: lmplex.Engine) -> None:
    by_model = engine.chat(_ask("A quick recipe, as JSON."), _params(StructuredOutputsParams(json=Recipe)))
    recipe = Recipe.model_validate_json(by_model.text)
    assert 1 <= len(recipe.steps) <= 3
    text = json.dumps(Recipe.model_json_schema())
    by_text = engine.chat(_ask("A quick recipe, as JSON."), _params(StructuredOutputsParams(json=text)))
    assert by_text.token_ids == by_model.token_ids


def test_regex_choice_grammar_and_json_object(engine: lmplex.Engine) -> None:
    cases: list[tuple[StructuredOutputsParams, str]] = [
        (StructuredOutputsParams(regex=r"[A-Z][a-z]{2,8} (19|20)\d\d"), r"[A-Z][a-z]{2,8} (19|20)\d\d"),
        (StructuredOutputsParams(choice=["positive", "negative", "neutral"]), r"positive|negative|neutral"),
        (
            StructuredOutputsParams(
                grammar='start: "SELECT " col " FROM " tbl\ncol: /[a-z]{1,8}/\ntbl: /[a-z]{1,8}/'
            ),
            r"SELECT [a-z]{1,8} FROM [a-z]{1,8}",
        ),
    ]
    for so, pattern in cases:
        for seed in range(3):
            out = engine.chat(_ask("Answer."), _params(so, temperature=1.0, seed=seed))
            assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), (so, out.text)
    obj = engine.chat(_ask("Some JSON, please."), _params(StructuredOutputsParams(json_object=True)))
    assert isinstance(json.loads(obj.text), dict)


def test_constrained_requests_are_batch_invariant(engine: lmplex.Engine) -> None:
    reqs = [_ask(f"Invent person {i}.") for i in range(6)]
    p = _params(StructuredOutputsParams(json=PERSON), temperature=0.9, seed=11)
    alone = [engine.generate([r], p)[0].token_ids for r in reqs]
    plain = SamplingParams(temperature=0.9, seed=5, max_tokens=40)
    prompts: list[str | list[dict[str, str]]] = [*reqs, "Once upon a time", "def fib(n):"]
    mixed = engine.generate(prompts, p)
    assert [o.token_ids for o in mixed[:6]] == alone
    engine.generate(["Once upon a time"], plain)  # unconstrained requests still run


def test_bad_constraints_raise_invalid_request(engine: lmplex.Engine) -> None:
    with pytest.raises(InvalidRequest, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(InvalidRequest, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(InvalidRequest, match="choice"):
        StructuredOutputsParams(choice=[])
    for so in [
        StructuredOutputsParams(json="{oops"),
        StructuredOutputsParams(json={"type": "no-such-type"}),
        StructuredOutputsParams(regex="(unclosed"),
        StructuredOutputsParams(grammar="start: missing_rule"),
    ]:
        with pytest.raises(InvalidRequest, match="structured output"):
            engine.chat(_ask("hi"), _params(so))
    assert StructuredOutputsParams(choice=["a", "b"]).kind == "choice"
    assert engine.chat(_ask("hi"), _params(StructuredOutputsParams(choice=["a", "b"]))).text in ("a", "b")
