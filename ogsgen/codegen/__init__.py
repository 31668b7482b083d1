"""The generator: renders kernel variants from jinja2 templates and writes build folders."""
from .build import BuildReport, CheckReport, build, check, render_catalog
from .render import RenderedKernel, render_variant, template_sha256

__all__ = ["BuildReport", "CheckReport", "build", "check", "render_catalog", "RenderedKernel", "render_variant",
           "template_sha256"]
