from jupyter_vgpu.cli import main

main()
