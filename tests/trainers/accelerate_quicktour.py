"""accelerate's quick tour (https://huggingface.co/docs/accelerate/quicktour): `Accelerator()`,
`prepare` the model, optimizer, data loaders and scheduler, `accelerator.backward(loss)` in the
training loop, `gather_for_metrics` in the evaluation. Launched by `accelerate launch` with the
config file the platform's tooling gives it (here: the entrypoint's accelerate.yaml, DeepSpeed
ZeRO-2 on CPU). Written as a user writes it: nothing from this project.

Run:  ENTRYPOINT_LAUNCHER=accelerate entrypoint run -- python accelerate_quicktour.py
"""

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 2


def make_data(n, seed):
    generator = torch.Generator().manual_seed(seed)
    inputs = torch.randn(n, 16, generator=generator)
    targets = (inputs[:, :8].sum(dim=1) > inputs[:, 8:].sum(dim=1)).long()
    return TensorDataset(inputs, targets)


def main():
    accelerator = Accelerator()
    device = accelerator.device

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    training_dataloader = DataLoader(make_data(256, 0), batch_size=2, shuffle=True)
    validation_dataloader = DataLoader(make_data(100, 1), batch_size=2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.9)
    loss_function = nn.CrossEntropyLoss()

    model, optimizer, training_dataloader, validation_dataloader, scheduler = accelerator.prepare(
        model, optimizer, training_dataloader, validation_dataloader, scheduler
    )

    model.train()
    for _ in range(EPOCHS):
        for inputs, targets in training_dataloader:
            optimizer.zero_grad()
            outputs = model(inputs.to(device))
            loss = loss_function(outputs, targets.to(device))
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()

    model.eval()
    correct = total = 0
    for inputs, targets in validation_dataloader:
        with torch.no_grad():
            predictions = model(inputs).argmax(dim=-1)
        all_predictions, all_targets = accelerator.gather_for_metrics((predictions, targets))
        correct += int((all_predictions == all_targets).sum())
        total += int(all_targets.numel())

    print(
        f"accelerate quick tour: process {accelerator.process_index} of "
        f"{accelerator.num_processes} ({accelerator.distributed_type}) evaluated {total} "
        f"examples, accuracy {correct / total:.2f}",
        flush=True,
    )
    accelerator.end_training()


if __name__ == "__main__":
    main()
