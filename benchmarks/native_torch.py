"""A plain PyTorch training script (DDP when started by torchrun): the baseline for unitrain's overhead."""

from __future__ import annotations

import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from native_common import StepTimer, parse_args
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from unitrain.backends.torch.models import ResNet
from unitrain.data import SyntheticDataset
from unitrain.models import MODELS

args = parse_args()
torch.set_num_threads(args.threads)
world, rank = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("RANK", "0"))
if world > 1:
    dist.init_process_group("gloo")
torch.manual_seed(0)
model = ResNet(MODELS.get(args.model), args.num_classes)
if world > 1:
    model = DistributedDataParallel(model)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
data = SyntheticDataset(args.steps * args.batch_size * world, args.image_size, args.num_classes)
sampler = DistributedSampler(data, num_replicas=world, rank=rank, seed=0, drop_last=True) if world > 1 else None
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, shuffle=sampler is None, drop_last=True,
                    num_workers=args.num_workers, persistent_workers=args.num_workers > 0)  # fmt: skip
model.train()
timer = StepTimer()
for step, (images, labels) in enumerate(loader):
    loss = F.cross_entropy(model(images), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    timer.step()
    if step + 1 == args.steps:
        break
if rank == 0:
    timer.write(args.out, last_loss=loss.item())
if world > 1:
    # Release DDP and its gloo work while the group still exists: left to interpreter
    # shutdown, it aborts the process ("terminate called without an active exception",
    # pytorch/pytorch#179291), about one run in ten here.
    dist.barrier()
    del model, optimizer, loss, loader
    gc.collect()
    dist.destroy_process_group()
