"""The PyTorch 2.0 tutorial's timm example: ``timm.create_model("resnext50_32x4d",
num_classes=2)`` with random weights (no download), in eval mode under no_grad.

    python examples/timm_resnext.py
    MINICOMPILE_LOGS=graph_breaks python examples/timm_resnext.py   # why each graph ends

On the CPU one 64x64 image in float32; on CUDA a batch of 8 at 224x224, in float32 and
bfloat16.  Convolutions are library calls; eval-mode batch norm, ReLU and the residual
adds are fused around them.  Prints the graphs, the graph breaks with their reasons, the
kernels, the cold first call and the median call of eager, minicompile and torch.compile;
the logits are checked against eager.
"""

import torch

from model_report import import_torchvision, report


def resnext(cuda: bool) -> torch.nn.Module:
    import_torchvision()
    import timm

    torch.manual_seed(0)
    model = timm.create_model("resnext50_32x4d", num_classes=2, pretrained=False).eval()
    # Random running statistics, so that batch norm is not the identity it starts as.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    return model


def main() -> None:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    model = resnext(cuda).to(device)
    shape = (8, 3, 224, 224) if cuda else (1, 3, 64, 64)
    torch.manual_seed(1)
    x = torch.randn(shape, device=device)
    name = torch.cuda.get_device_name() if cuda else "CPU"
    print(f"timm resnext50_32x4d, input {list(shape)} on {name}")
    tolerances = {torch.float32: dict(rtol=1e-3, atol=1e-3),
                  torch.bfloat16: dict(rtol=5e-2, atol=5e-2)}

    for dtype in (torch.float32, torch.bfloat16) if cuda else (torch.float32,):
        model = model.to(dtype)

        def check(actual, expected, tol=tolerances[dtype]):  # noqa: ANN001
            torch.testing.assert_close(actual, expected, **tol)

        with torch.no_grad():
            report(f"resnext50_32x4d {str(dtype).removeprefix('torch.')}", model,
                   dict(x=x.to(dtype)), check, cuda)


if __name__ == "__main__":
    main()
