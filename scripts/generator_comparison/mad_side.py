"""MAD's own code (athms/mad-lab @ 0f49a45: mad/data/instances.py, mad/data/dataset.py,
mad/configs.py, mad/paths.py and configs/tasks/*.yml copied unchanged; mad/registry.py cut to
its task_registry, without the layer and model imports) generating each task's data as its
train.py does: seeds set, then generate_data(mad_config.instance_fn, mad_config.instance_fn_kwargs,
...) with num_workers=0."""
import os, random, shutil, sys, time
import numpy as np
import torch
from mad.configs import MADConfig, load_yml
from mad.data import generate_data
from mad.registry import task_registry

from mad_cases import CASES  # (task, changes over the yml baseline)

if __name__ == "__main__":
    out = {}
    for i, (task, change) in enumerate(CASES):
        base = load_yml(task_registry[task]["cfg"])["baseline"]
        cfg = MADConfig()
        cfg.update_from_kwargs({**base, "task": task, **change})
        random.seed(cfg.seed); np.random.seed(cfg.seed); torch.manual_seed(cfg.seed)  # train.py
        path = f"/tmp/mad_cmp/data/{i}"
        shutil.rmtree(path, ignore_errors=True)
        t = time.time()
        data = generate_data(instance_fn=cfg.instance_fn, instance_fn_kwargs=cfg.instance_fn_kwargs,
                             train_data_path=path + "/train", test_data_path=path + "/test",
                             num_train_examples=cfg.num_train_examples,
                             num_test_examples=cfg.num_test_examples, num_workers=0, verbose=False)
        for split in ("train", "test"):
            out[f"{i}_{split}_inputs"] = data[split].inputs
            out[f"{i}_{split}_targets"] = data[split].targets
        print(i, task, change, cfg.num_train_examples, cfg.num_test_examples, f"{time.time() - t:.1f}s", flush=True)
    np.savez_compressed("/tmp/mad_cmp/mad_out.npz", **out)

