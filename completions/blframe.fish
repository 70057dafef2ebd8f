# fish completion for blframe
complete -c blframe -f
complete -c blframe -s d -l decode -d 'Decode frames instead of encoding'
complete -c blframe -s c -l code -x -a 'T U I N auto' -d 'Frame code when encoding'
complete -c blframe -s e -l exact -d 'Keep a trailing newline in T and U bodies'
complete -c blframe -s l -l lines -d 'Encode each input line as its own frame'
complete -c blframe -s r -l raw -d 'Decode: write bodies exactly'
complete -c blframe -s i -l images -x -a '(__fish_complete_directories (commandline -ct | string replace -r -- "^--[^=]*=" ""))' -d 'Decode: save I frames in DIR'
complete -c blframe -s j -l json -d 'Decode: one JSON object per frame'
complete -c blframe -s s -l resync -d 'Decode: skip bytes that do not start a frame'
complete -c blframe -s h -l help -d 'Show help and exit'
complete -c blframe -l version -d 'Show the version and exit'
