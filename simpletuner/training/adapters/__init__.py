"""The adapters a LoRA run trains: peft LoRA, LyCORIS, their file formats and init_lora."""
