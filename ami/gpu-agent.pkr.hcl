# Layers the gpu-agent package onto the EKS-optimized accelerated (NVIDIA) Amazon Linux 2023
# AMI, x86_64 or arm64 (Grace: p6e-gb200/gb300; Graviton: g5g). Build (see README.md):
#   packaging/build-packages.sh
#   packer build -var kubernetes_version=1.33 -var region=us-west-2 ami/
#   packer build -var architecture=arm64 ... ami/    (with the aarch64 .rpm)

variable "region" {
  type        = string
  default     = "us-west-2"
  description = "Region to build in; the AMI is registered there."
}

variable "kubernetes_version" {
  type        = string
  default     = "1.33"
  description = "EKS Kubernetes minor version of the source AMI."
}

variable "architecture" {
  type        = string
  default     = "x86_64"
  description = "x86_64 or arm64: the source AMI's (the EKS AL2023 NVIDIA AMI of that architecture; arm64 is the one EKS recommends for p6e-gb200/gb300 and g5g), the build instance's and the package's."

  validation {
    condition     = var.architecture == "x86_64" || var.architecture == "arm64"
    error_message = "The architecture must be x86_64 or arm64."
  }
}

variable "source_ami_owner" {
  type        = string
  default     = "602401143452"
  description = "Account that publishes the EKS-optimized AMIs (amazon-eks)."
}

variable "build_instance_type" {
  type        = string
  default     = ""
  description = "Instance the bake runs on (of the AMI's architecture); empty: m6i.large for x86_64, m7g.large for arm64. No GPU is needed to install the package."
}

variable "package" {
  type        = string
  default     = ""
  description = "The gpu-agent .rpm built by packaging/build-packages.sh (relative to where packer runs: the repository root); empty: target/packages/gpu-agent-0.1.0-1.<x86_64|aarch64>.rpm."
}

variable "subnet_id" {
  type        = string
  default     = ""
  description = "Subnet for the build instance; empty: the default VPC."
}

locals {
  timestamp = regex_replace(timestamp(), "[- TZ:]", "")
  # The rpm names the 64-bit ARM architecture aarch64 where EC2 says arm64.
  rpm_arch       = var.architecture == "arm64" ? "aarch64" : "x86_64"
  package        = var.package != "" ? var.package : "target/packages/gpu-agent-0.1.0-1.${local.rpm_arch}.rpm"
  instance_type  = var.build_instance_type != "" ? var.build_instance_type : (var.architecture == "arm64" ? "m7g.large" : "m6i.large")
}

source "amazon-ebs" "eks-al2023-nvidia" {
  region        = var.region
  instance_type = local.instance_type
  subnet_id     = var.subnet_id
  ssh_username  = "ec2-user"
  ami_name      = "gpu-agent-eks-al2023-${var.architecture}-nvidia-${var.kubernetes_version}-${local.timestamp}"
  ami_description = "EKS ${var.kubernetes_version} accelerated AL2023 ${var.architecture} AMI with gpu-agent"

  # The newest EKS-optimized accelerated AL2023 AMI for this Kubernetes version; the same
  # AMI the SSM parameter
  # /aws/service/eks/optimized-ami/<version>/amazon-linux-2023/<arch>/nvidia/recommended/image_id
  # names.
  source_ami_filter {
    filters = {
      name                = "amazon-eks-node-al2023-${var.architecture}-nvidia-${var.kubernetes_version}-v*"
      architecture        = var.architecture
      root-device-type    = "ebs"
      virtualization-type = "hvm"
    }
    owners      = [var.source_ami_owner]
    most_recent = true
  }

  tags = {
    Name               = "gpu-agent-eks-al2023-${var.architecture}-nvidia-${var.kubernetes_version}"
    "gpu-agent:source" = "{{ .SourceAMIName }}"
  }
}

build {
  sources = ["source.amazon-ebs.eks-al2023-nvidia"]

  provisioner "file" {
    source      = local.package
    destination = "/tmp/gpu-agent.rpm"
  }

  provisioner "shell" {
    inline = [
      "set -eux",
      "sudo dnf install -y /tmp/gpu-agent.rpm",
      "rm -f /tmp/gpu-agent.rpm",
      "systemctl is-enabled gpu-agent.service gpu-agent-kubelet-config.service",
      "gpu-agent --version",
      # The package's architecture is the image's (an x86_64 package on arm64 would not run).
      "test \"$(rpm -q --qf '%%{ARCH}' gpu-agent)\" = \"$(uname -m)\"",
      # The bake boot's kernel-log cursor and faults must not ship in the image: the state
      # belongs to the instance that runs it (/var/lib/private is where an older, DynamicUser
      # build of the unit kept it).
      "sudo systemctl stop gpu-agent.service",
      "sudo rm -rf /var/lib/private/gpu-agent /var/lib/gpu-agent",
    ]
  }
}
