"""Training a run: ``train(cfg, run_dir)`` builds the run's parts once (train.py), the loop
steps over them (train_loop.py), writing checkpoints (checkpoint.py); a stopped run resumes
(resume.py) and a fine-tune starts from its parent's weights (finetune.py)."""
