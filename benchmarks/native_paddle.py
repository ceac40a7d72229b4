"""A plain Paddle Fleet training script, in the style of Paddle's data-parallel tutorial
(paddle.vision.models, fleet.init, distributed_model, distributed_optimizer,
DistributedBatchSampler): the baseline for unitrain's overhead. Started alone, or by
paddle.distributed.launch. It shares nothing with unitrain but the dataset definition."""

from __future__ import annotations

import os
import warnings

warnings.filterwarnings("ignore", message="No ccache found")

import paddle  # noqa: E402
import paddle.nn.functional as F  # noqa: E402
from native_common import StepTimer, parse_args  # noqa: E402
from paddle.distributed import fleet  # noqa: E402
from paddle.vision import models  # noqa: E402

from unitrain.data.datasets import SyntheticDataset  # noqa: E402

args = parse_args()
paddle.base.core.set_num_threads(args.threads)
world = int(os.environ.get("PADDLE_TRAINERS_NUM", "1"))
if world > 1:
    fleet.init(is_collective=True, strategy=fleet.DistributedStrategy())
paddle.seed(0)
model = getattr(models, args.model)(num_classes=args.num_classes)
optimizer = paddle.optimizer.Momentum(
    learning_rate=args.lr, momentum=0.9, parameters=model.parameters(), weight_decay=paddle.regularizer.L2Decay(1e-4)
)
if world > 1:  # fleet.distributed_model fails at world size 1 in paddle 3.3.1
    model = fleet.distributed_model(model)
    optimizer = fleet.distributed_optimizer(optimizer)
data = SyntheticDataset(args.steps * args.batch_size * world, args.image_size, args.num_classes)
sampler = paddle.io.DistributedBatchSampler(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
loader = paddle.io.DataLoader(data, batch_sampler=sampler, num_workers=args.num_workers, return_list=True)
model.train()
timer = StepTimer()
for step, (images, labels) in enumerate(loader):
    loss = F.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    optimizer.clear_grad()
    timer.step()
    if step + 1 == args.steps:
        break
if int(os.environ.get("PADDLE_TRAINER_ID", "0")) == 0:
    timer.write(args.out, last_loss=loss.item())
