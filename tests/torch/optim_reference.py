"""Prints the torch.optim reference trajectories that tests/test_optim.cpp embeds.

Each case minimises sum((p - c)^2) from p0 with gradient 2 (p - c), set by hand (no autograd), for
STEPS steps, in float64 and float32, and prints p after every step as C++ initializer lists.
Regenerate with Debian's torch:  /usr/bin/python3 tests/torch/optim_reference.py
"""
import torch

P0 = [0.5, -1.0, 2.0, -0.25, 0.0]
C = [1.0, 0.5, -1.0, 0.25, -2.0]
STEPS = 6

CASES = [
    ("sgd_plain", torch.optim.SGD, dict(lr=0.1)),
    ("sgd_momentum", torch.optim.SGD, dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("sgd_nesterov", torch.optim.SGD, dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02)),
    ("adam_default", torch.optim.Adam, dict(lr=0.1)),
    ("adam_tuned", torch.optim.Adam, dict(lr=0.05, betas=(0.8, 0.99), eps=1e-3, weight_decay=0.1)),
]


def trajectory(opt_class, kwargs, dtype):
    p = torch.tensor(P0, dtype=dtype, requires_grad=True)
    c = torch.tensor(C, dtype=dtype)
    opt = opt_class([p], **kwargs)
    steps = []
    for _ in range(STEPS):
        with torch.no_grad():
            p.grad = 2 * (p - c)
        opt.step()
        steps.append(p.detach().clone())
    return steps


def cxx(rows, fmt):
    return "{\n    " + ",\n    ".join("{" + ", ".join(fmt(float(x)) for x in row) + "}" for row in rows) + "}"


print(f"// torch {torch.__version__}, tests/torch/optim_reference.py")
for name, opt_class, kwargs in CASES:
    f64 = trajectory(opt_class, kwargs, torch.float64)
    f32 = trajectory(opt_class, kwargs, torch.float32)
    print(f"// {name}: {opt_class.__name__}({kwargs})")
    print(f"const Trajectory k_{name}_f64 = {cxx(f64, lambda x: repr(x))};")
    print(f"const Trajectory k_{name}_f32 = {cxx(f32, lambda x: repr(x) + ('f' if '.' in repr(x) or 'e' in repr(x) else '.0f'))};")
