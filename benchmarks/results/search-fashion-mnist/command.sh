#!/bin/bash
mkdir -p multirun/search-fmnist
A="experiment=fashion_mnist_resnet18 trainer.steps=100 trainer.epochs=1 trainer.eval_every=0 trainer.checkpoint_every=0 data.val_samples=2000 optim.warmup_steps=20 trainer.progress=false trainer.threads=2 hydra.sweeper.n_trials=5"
for b in torch paddle; do
  .venv/bin/python -m unitrain -m hydra/sweeper=optuna backend=$b $A 'optim.lr=tag(log,interval(0.02,0.4))' 'optim.weight_decay=tag(log,interval(1e-5,1e-3))' hydra.sweep.dir=multirun/search-fmnist/$b > multirun/search-fmnist/$b.log 2>&1
  echo "$b rc=$?" >> multirun/search-fmnist/status
done
.venv/bin/python -m unitrain.compare multirun/search-fmnist/paddle multirun/search-fmnist/torch --out multirun/search-fmnist/best > multirun/search-fmnist/compare.log 2>&1
echo "compare rc=$?" >> multirun/search-fmnist/status
