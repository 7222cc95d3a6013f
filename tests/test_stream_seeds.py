"""Acceptance streams' seeds worked out over many request ids are numpy's SeedSequence's, and the
generators seeded from them draw what numpy's own would."""
import math
import random

import numpy as np
import pytest

from sim.engine.acceptance import FIRST_BLOCK_MARGIN, SEED_BLOCK, SEED_BLOCKS_KEPT, AcceptanceModel, AcceptanceStream
from sim.engine.stream_seeds import Seeded, seed_words, uint32_words

SEEDS = (0, 1, 7, 2**32 - 1, 2**32, 2**40 + 5, 2**70 + 3, 2**130 + 11)
ID_BLOCKS = (0, 1024, 5 * 1024, 2**32 - 1024, 2**32, 2**50, 2**64 - 1024)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("first", ID_BLOCKS)
def test_seed_words_are_seed_sequences(seed, first):
    words = seed_words(seed, first, 1024)
    assert words.shape == (1024, 4) and words.dtype == np.uint64
    rng = random.Random(seed ^ first)
    for j in [0, 1, 1023] + rng.sample(range(1024), 12):
        want = np.random.SeedSequence([seed, first + j]).generate_state(4, np.uint64)
        assert words[j].tolist() == want.tolist(), (seed, first + j)


def test_seeded_generator_draws_numpys_stream():
    words = seed_words(3, 0, 1024)
    for rid in (0, 42, 1023):
        ours = np.random.Generator(np.random.PCG64(Seeded(words[rid]))).random(50)
        numpys = np.random.Generator(np.random.PCG64(np.random.SeedSequence([3, rid]))).random(50)
        assert ours.tolist() == numpys.tolist()


def test_uint32_words_and_bad_ranges():
    assert uint32_words(0) == [0] and uint32_words(2**32 + 5) == [5, 1]
    with pytest.raises(ValueError, match="non-negative"):
        uint32_words(-1)
    with pytest.raises(ValueError, match="word count"):
        seed_words(0, 2**32 - 2, 4)  # ids of one word and of two
    with pytest.raises(ValueError, match="word count"):
        seed_words(0, 2**64 - 2, 4)
    with pytest.raises(ValueError, match="4 uint64"):
        Seeded(seed_words(0, 0, 1)[0]).generate_state(8, np.uint32)


@pytest.mark.parametrize("output_tokens", [None, 1, 7, 60, 333, 5000])
def test_model_streams_read_as_plain_ones(output_tokens):
    """Precomputed seeds and a first block sized by the output length change how a stream is read,
    never its counts."""
    model = AcceptanceModel((1, 1, 1), seed=11)
    for rid in (0, 5, SEED_BLOCK + 3, 2**33 + 1):
        stream = model.stream(rid, output_tokens=output_tokens)
        plain = AcceptanceStream(11, rid, model.thresholds(""))
        got = stream.ahead(40).tolist() + [stream.accepted_drafts() for _ in range(1500)]
        assert got == plain.ahead(40).tolist() + [plain.accepted_drafts() for _ in range(1500)]


def test_first_block_covers_the_expected_verify_steps():
    model = AcceptanceModel((1, 1, 1), seed=0)
    stream = model.stream(0, output_tokens=333)
    stream.accepted_drafts()
    assert stream.drawn + 1 == math.ceil(333 / model.expected_len() * FIRST_BLOCK_MARGIN)


def test_model_keeps_few_seed_blocks_and_ids_outside_them():
    model = AcceptanceModel((1, 1, 1), seed=2)
    for block in range(SEED_BLOCKS_KEPT + 3):
        model.stream(block * SEED_BLOCK)
    assert len(model._seed_blocks) == SEED_BLOCKS_KEPT
    big = model.stream(2**64 + 9)  # past what the blocks cover: numpy's SeedSequence seeds it
    assert big.ahead(30).tolist() == AcceptanceStream(2, 2**64 + 9, model.thresholds("")).ahead(30).tolist()
    with pytest.raises(ValueError, match="non-negative"):
        model.stream(-1)
