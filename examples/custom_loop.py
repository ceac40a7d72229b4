"""Your own training loop, written once against unitrain's interfaces, run on either framework.

python examples/custom_loop.py torch
python examples/custom_loop.py paddle
"""

import sys

import unitrain

backend = unitrain.get_backend(sys.argv[1] if len(sys.argv) > 1 else "torch")
backend.set_threads(2)
backend.seed(0)
data = unitrain.LearnableDataset(num_samples=512, image_size=16, num_classes=4)

with backend.distributed() as dist:
    model = unitrain.build_model(backend, "tiny", num_classes=4, image_size=16, device=dist.device)
    optimizer = backend.build_optimizer(model, unitrain.OptimConfig(lr=0.05))
    precision = backend.precision(unitrain.AmpConfig(level="O0"))
    model, optimizer = precision.decorate(model, optimizer)
    model, optimizer = dist.wrap_model(model), dist.wrap_optimizer(optimizer)
    sampler = unitrain.DistributedBatchSampler(len(data), 32, dist.world_size, dist.rank, seed=0)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for images, labels in backend.make_loader(data, sampler, device=dist.device):
            with precision.autocast():
                loss = backend.loss(model(images), labels)
            precision.backward(loss)
            precision.step(optimizer)
            optimizer.zero_grad()
        loss = dist.all_reduce(float(backend.to_numpy(loss)))
        if dist.is_main_process:
            print(f"{backend.name} epoch {epoch} loss {loss:.4f}")
