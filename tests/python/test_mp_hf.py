"""Hugging Face models wrapped unchanged in smp.DistributedModel (mp_hf_worker.py):
GPT-2 (tied embeddings), BERT, a Llama-style model and T5 from transformers, built
from configs with random weights, trained with the pipeline against plain
training: 2 ranks (2 partitions; every model under both schedules) and 4
ranks (2 partitions x 2 replicas; one schedule each); automatic partitions, and
manual ones made with smp.set_partition on the built model."""

import pytest

from harness import HERE, assert_all_passed, run_job

pytest.importorskip("transformers", reason="the Hugging Face tests need transformers (make setup-test installs it)")
WORKER = HERE / "mp_hf_worker.py"


@pytest.mark.parametrize("world_size", [2, 4])
def test_hugging_face_models_train_as_plain(world_size):
    passed = assert_all_passed(run_job("hf", world_size, args=["2"], worker=WORKER, timeout=300))
    assert len(passed) == (10 if world_size == 2 else 5), passed
