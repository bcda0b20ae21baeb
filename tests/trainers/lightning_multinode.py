"""Lightning's own example, the LitAutoEncoder of its introduction
(https://lightning.ai/docs/pytorch/stable/starter/introduction.html), trained as its multi-node
guide shows (https://lightning.ai/docs/pytorch/stable/clouds/cluster_intermediate_1.html):
`Trainer(num_nodes=2, devices=2, strategy="ddp")`, here on CPU. Lightning finds its place from
the environment torchrun sets (its TorchElasticEnvironment); random images stand in for MNIST,
so nothing is downloaded. Lightning is not in the image: a derived image installs it
(tests/compat/Dockerfile.lightning). Written as a user writes it: nothing from this project.

Run:  entrypoint run -- python lightning_multinode.py
"""

import lightning as L
import torch
from torch import nn, optim
from torch.utils.data import DataLoader, TensorDataset


class LitAutoEncoder(L.LightningModule):
    def __init__(self, encoder, decoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def training_step(self, batch, batch_idx):
        x, _ = batch
        x = x.view(x.size(0), -1)
        z = self.encoder(x)
        x_hat = self.decoder(z)
        loss = nn.functional.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return optim.Adam(self.parameters(), lr=1e-3)


def main():
    encoder = nn.Sequential(nn.Linear(28 * 28, 64), nn.ReLU(), nn.Linear(64, 3))
    decoder = nn.Sequential(nn.Linear(3, 64), nn.ReLU(), nn.Linear(64, 28 * 28))
    autoencoder = LitAutoEncoder(encoder, decoder)

    images = torch.rand(256, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    train_loader = DataLoader(TensorDataset(images, torch.zeros(256)), batch_size=16)

    trainer = L.Trainer(
        num_nodes=2,
        devices=2,
        accelerator="cpu",
        strategy="ddp",
        max_epochs=1,
        default_root_dir="/tmp/lightning",
    )
    trainer.fit(model=autoencoder, train_dataloaders=train_loader)
    print(
        f"lightning: global rank {trainer.global_rank} of {trainer.world_size} "
        f"(node {trainer.node_rank}, local rank {trainer.local_rank}) finished "
        f"{trainer.global_step} steps",
        flush=True,
    )


if __name__ == "__main__":
    main()
