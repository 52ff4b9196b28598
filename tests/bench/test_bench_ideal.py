"""The ideal: tokens new since the previous request, and the labels that explain the rest."""

import pytest

from bench.ideal import (
    Ideal,
    Label,
    PromptTokens,
    common_prefix,
    ideal,
    label,
    reply_rendered,
    reply_tokenized_anew,
    resumed_before_divergence,
)
from loopcommon.jsonbytes import dumps
from loopd.engine.client import InferenceClient, make_async_client
from loopd.engine.limits import Limits
from loopd.engine.request import RequestSettings, Sampling, build_body
from loopd.engine.stream import run_request
from loopd_dev.devserver import PLAIN_MODEL
from tests.bench.fake_server import fake_server


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0


def test_the_first_request_is_all_new() -> None:
    assert ideal([1, 2, 3], None, 0) == Ideal(3, 0, rewritten=False)


def test_the_previous_prompt_and_the_generated_reply_are_not_new() -> None:
    previous = [1, 2, 3]
    current = [1, 2, 3, 7, 8, 9, 4, 5]  # 7 8 9: the reply as generated; 4 5: a new message
    assert ideal(current, previous, carried_reply=3) == Ideal(2, 6, False, shared_previous=3)
    assert ideal(current, previous, carried_reply=0).new_tokens == 5  # a scripted reply


def test_text_the_template_rewrote_counts_as_new() -> None:
    found = ideal([1, 2, 9, 4], [1, 2, 3], carried_reply=5)
    assert found == Ideal(2, 2, True, shared_previous=3)


def test_a_reply_whose_reasoning_was_left_out_is_not_carried() -> None:
    found = ideal([1, 2, 3, 8, 4], [1, 2, 3], carried_reply=2, reply_rendered=False)
    assert found == Ideal(2, 3, True, shared_previous=3)


def test_reply_rendered_looks_for_the_trimmed_reasoning() -> None:
    assert reply_rendered("<think>\nfirst, read\n</think>", "  first, read\n")
    assert not reply_rendered("<|im_start|>assistant\nanswer", "first, read")
    assert reply_rendered("anything", "")


@pytest.mark.parametrize(
    ("index", "found", "capped", "expected"),
    [
        (0, Ideal(5, 0, False), False, Label.FIRST),
        (3, Ideal(5, 9, True), True, Label.CAPPED),
        (3, Ideal(5, 9, True), False, Label.TEMPLATE_REWRITE),
        (3, Ideal(5, 9, False), False, Label.NONE),
    ],
)
def test_labels(index: int, found: Ideal, capped: bool, expected: Label) -> None:
    assert label(index, found, capped) is expected


def test_a_reply_the_server_reread_from_inside_is_labelled() -> None:
    # The previous prompt had 503 tokens and the model generated 31 after it.
    assert reply_tokenized_anew(503, 31, server_cache_n=508)
    assert not reply_tokenized_anew(503, 31, server_cache_n=534)  # all of it reused
    assert not reply_tokenized_anew(503, 31, server_cache_n=400)  # the prompt itself differed
    assert not reply_tokenized_anew(503, 0, server_cache_n=503)  # a scripted reply: nothing kept
    assert label(3, Ideal(5, 9, False), False, retokenized=True) is Label.RETOKENIZED


def test_a_tail_the_tokenizer_cut_anew_is_not_the_templates_doing() -> None:
    """The previous prompt's text is still a prefix, but its last token changed."""
    found = ideal([1, 2, 9, 4, 5], [1, 2, 3], carried_reply=0)
    assert label(2, found, False, text_kept=True) is Label.TAIL_TOKENIZED
    assert label(2, found, False, text_kept=False) is Label.TEMPLATE_REWRITE


def test_a_resume_before_the_divergence_is_a_checkpoint() -> None:
    found = ideal([1, 2, 3, 4, 5], [1, 2, 3], carried_reply=0)
    assert label(2, found, False, before_divergence=3) is Label.CHECKPOINT
    assert label(2, found, False, before_divergence=2) is Label.NONE


@pytest.mark.anyio
async def test_counted_tokens_match_what_the_server_processed() -> None:
    settings = RequestSettings(model=PLAIN_MODEL, slot=0, max_tokens=4, sampling=Sampling())
    messages = [
        dumps({"role": "system", "content": "Be brief."}),
        dumps({"role": "user", "content": "Hi there"}),
    ]
    body = build_body(settings, "", messages)
    async with fake_server() as url:
        async with InferenceClient(url, PLAIN_MODEL) as client:
            result = await run_request(client, body, slot=0, limits=Limits())
        async with make_async_client(url, connect_s=5.0) as http:
            prompt = await PromptTokens(http, PLAIN_MODEL).of(body)
    timings = result.assembler.timings
    assert timings is not None
    assert len(prompt.tokens) == timings.cache_n + timings.prompt_n
    assert "Hi there" in prompt.text


def test_a_hybrid_model_resumes_a_reply_tokenized_anew_at_its_checkpoint() -> None:
    """The previous prompt was 100 tokens and the model generated 30: a pure transformer keeps
    the prompt and part of the reply, a hybrid one goes back to 4 tokens before the prompt's end."""
    assert reply_tokenized_anew(100, 30, 110)
    assert reply_tokenized_anew(100, 30, 96)
    assert not reply_tokenized_anew(100, 30, 0)  # a cold cache is not the reply's doing
    assert not reply_tokenized_anew(100, 0, 96)  # a scripted reply was never generated
    found = ideal(list(range(140)), list(range(100)), carried_reply=30)
    assert resumed_before_divergence(found, 100, True, 96) == 4
    assert resumed_before_divergence(found, 100, False, 96) == 34
