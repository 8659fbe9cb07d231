"""``python tests/finetune_probe.py OUT CLI_ARGS...``: run ``vlp CLI_ARGS`` (a fine-tuning command)
and record what this process evaluated, in ``OUT.rank{RANK}.json``: the ITM pairs it scored (retrieval),
the questions whose answers it ranked (VQA) and the statements it classified (NLVR2).

Launched alone or under ``torch.distributed.run`` by tests/test_finetune_dist.py: with two
processes, both must take part in every validation and in the final test evaluation, each on its
own shard.
"""

from __future__ import annotations

import json
import os
import sys

import vlp.eval.retrieval as retrieval
import vlp.runs.training.finetune.classification as classification
import vlp.runs.training.finetune.vqa as vqa
from vlp.cli import main

seen = {"itm_pairs": 0, "itm_calls": 0, "vqa_questions": 0, "vqa_calls": 0, "nlvr_items": 0, "nlvr_calls": 0}


def _count(module, name, items, calls, size):
    original = getattr(module, name, None)
    if original is None:  # an older vlp without this evaluator
        return

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        seen[items] += size(args, out)
        seen[calls] += 1
        return out

    setattr(module, name, wrapped)


_count(retrieval, "itm_scores", "itm_pairs", "itm_calls", lambda args, out: len(out))
_count(vqa, "rank_answer_indices", "vqa_questions", "vqa_calls", lambda args, out: len(out))
# NLVR2 and SNLI-VE classify through one function; the probe's runs are NLVR2's
_count(classification, "classify_correct", "nlvr_items", "nlvr_calls", lambda args, out: len(out))

if __name__ == "__main__":
    out, args = sys.argv[1], sys.argv[2:]
    code = main(args)
    with open(f"{out}.rank{os.environ.get('RANK', '0')}.json", "w") as f:
        json.dump({"code": code, **seen}, f)
    sys.exit(code)
