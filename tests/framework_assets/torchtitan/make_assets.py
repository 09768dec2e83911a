"""A tiny tokenizer and text dataset for torchtitan, made offline (in the torchtitan venv,
which has `tokenizers`): ``python make_assets.py OUT`` writes ``OUT/tokenizer`` (for
``--model.hf_assets_path``) and ``OUT/data/train.json`` (for ``--training.dataset c4_test
--training.dataset_path``)."""

import json
import random
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

out = Path(sys.argv[1])
(out / "tokenizer").mkdir(parents=True, exist_ok=True)
(out / "data").mkdir(parents=True, exist_ok=True)
rng = random.Random(0)
words = ["energy", "pipeline", "stage", "clock", "forward", "backward", "plan", "frontier",
         "the", "a", "of", "to", "and", "gpu", "time", "power", "bloat", "job", "round", "rank"]  # fmt: skip
lines = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(400)]
tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
tokenizer.train_from_iterator(
    lines,
    trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    ),
)
tokenizer.save(str(out / "tokenizer" / "tokenizer.json"))
(out / "tokenizer" / "tokenizer_config.json").write_text(
    json.dumps(
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|end_of_text|>",
            "add_bos_token": True,
            "add_eos_token": False,
        }
    )
)
with open(out / "data" / "train.json", "w") as f:
    for line in lines:
        f.write(json.dumps({"text": line}) + "\n")
