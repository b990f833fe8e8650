"""Evaluation of a trained model by length: the "test long" half of posbench. Every number posbench
reports is made here one way, so reading these modules is reading the protocol:

    perplexity.py     a corpus's validation split at each length: which windows, inside which
                        documents, scored how, recorded how (``evaluate``)
    task_accuracy.py  a task's answers at each length: the model's own answer, accuracy,
                        prompt-blind baselines (``evaluate_task``)
    positions.py      where each window or example sits: at 0..L-1, or at randomized positions
                        drawn as training drew them
    run.py            a trained run on its own validation data (``evaluate_run``), and the
                        eval-time RoPE extensions it can be measured with
    decode.py         greedy decoding of a task's autoregressive answers, with the KV cache
    memory.py         the memory a forward pass needs, and whether a length fits
    compiled.py       eval.compile: the windows' forward passes compiled once per length
    reevaluate.py     ``posbench eval``: which run, and where its new records go
    diagnose.py       attention statistics by position (``diagnose_run``)
"""
