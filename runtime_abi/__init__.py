"""pdlkit.runtime_abi: kernel declarations, the kernel registry, loaders and torch.library binding."""

from pdlkit.runtime_abi.kernel import KernelDecl, KernelDeclarationError, KernelUnsupported, kernel

__all__ = ["KernelDecl", "KernelDeclarationError", "KernelUnsupported", "kernel"]
