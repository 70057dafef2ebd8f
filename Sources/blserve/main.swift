import BLCommand

Tool.run(BlserveCommand.spec) { options in
    try Server.main(try ServeConfig(options))
}
